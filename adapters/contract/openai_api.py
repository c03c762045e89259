"""What an engine's OpenAI-compatible server does, as its adapter declares it, and the request bodies
every client sends it:

- `ServerApi`: what a server's /v1/completions does where OpenAI's API leaves it open (prompt as token
  ids or text, how token ids come back, how prompt logprobs are asked for, whether EOS can be ignored,
  which sampling fields make a completion greedy and unpenalised).
- `ServerLaunch`: the command an adapter gives for its server, and the facts stored with its cells.
- `completion_body`: the one request body the load generator, the output capture and
  `bench diff-endpoints` send.
- `stream_count`: how a stream's tokens are counted chunk by chunk (what the body asks the server for).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Union

Prompt = Union[str, list[int], list[dict]]   # text, token ids, or a chat's messages ([{role, content}])


@dataclass(frozen=True)
class ServerApi:
    """What a server's /v1/completions does, where OpenAI's API leaves it open."""

    prompt_ids: bool                 # takes `prompt` as a list of token ids (else: text)
    ids_in_logprobs: bool            # `return_tokens_as_token_ids`: tokens come back as "token_id:<id>"
    prompt_logprobs: Literal["prompt_logprobs", "echo"] | None   # how teacher-forced logprobs are asked for
    ignore_eos: bool                 # honours `ignore_eos` (else a completion may stop early at EOS)
    batches: bool                    # runs concurrent requests together (else one at a time: batch_mode sequential)
    greedy_fields: dict = field(default_factory=dict)    # sampling fields that make temperature 0 plain greedy
    stream_usage: bool = False       # honours stream_options.continuous_usage_stats (exact tokens per chunk)
    stream_token_ids: bool = False   # honours `return_token_ids`: each stream chunk carries its new token ids
    tokenize_path: str | None = None  # the server's own tokenizer endpoint, to check text prompts' ids
    health_path: str = "/v1/models"
    logprobs: bool = True            # returns logprobs at all (else outputs are not captured)
    chat: bool = False               # /v1/chat/completions renders the model's own chat template (chat workloads)
    chat_tokenize: bool = False      # tokenize_path takes {messages, add_generation_prompt}: the template's ids


@dataclass
class ServerLaunch:
    """The command an adapter gives for its server, and the facts stored with its cells."""

    argv: list[str]
    model_name: str                  # the `model` field requests must carry
    env: dict[str, str] = field(default_factory=dict)
    engine_args: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    to_id: Callable[[str], int] | None = None   # token string -> id, where the server returns strings
    reset_path: str | None = None    # POST here empties the server's prefix cache (before every timed run)


def completion_body(api: ServerApi, prompt: Prompt, max_tokens: int, seed: int, stream: bool, model: str | None,
                    logprobs: int | None = None, ignore_eos: bool = True, prompt_logprobs: bool = False) -> dict:
    chat = is_chat(prompt)
    if chat and (logprobs is not None or prompt_logprobs):
        raise ValueError("chat requests carry no logprobs here (the capture goes through /v1/completions)")
    body: dict[str, Any] = {"messages" if chat else "prompt": prompt, "max_tokens": max_tokens, "seed": seed,
                            "stream": stream, "temperature": 0.0, **api.greedy_fields}
    if model:
        body["model"] = model
    if stream:   # the final usage always (one event); per chunk only what the count needs (stream_count)
        how = stream_count(api, logprobs)
        body["stream_options"] = {"include_usage": True, **({"continuous_usage_stats": True} if how == "usage" else {})}
        if how == "token_ids":
            body["return_token_ids"] = True
    if ignore_eos and api.ignore_eos:
        body["ignore_eos"] = True
    if logprobs is not None:
        body["logprobs"] = logprobs
        if api.ids_in_logprobs:
            body["return_tokens_as_token_ids"] = True
    if prompt_logprobs and logprobs is not None:
        if api.prompt_logprobs == "prompt_logprobs":
            body["prompt_logprobs"] = logprobs
        elif api.prompt_logprobs == "echo":
            body["echo"] = True
    return body


StreamCount = Literal["logprobs", "token_ids", "usage", "text"]

STREAM_COUNT_NOTES = {
    "logprobs": "the logprobs asked for (one entry per token)",
    "token_ids": "the token ids each chunk carries (return_token_ids; no per-chunk usage asked)",
    "usage": "the server's usage on every chunk (stream_options.continuous_usage_stats)",
    "text": "one per chunk that carries text (this server gives no exact per-chunk count; the final usage's "
            "total wins)",
}


def stream_count(api: ServerApi, logprobs: int | None = None) -> StreamCount:
    """How a stream's tokens are counted chunk by chunk, exactly where the server allows (several tokens may
    come in one chunk: speculative decoding), asking it for as little as that needs: the logprobs where they
    are asked anyway, else each chunk's token ids, else usage on every chunk, else one per chunk with text.
    The final usage (the total, and the prompt's length) is asked in every case."""
    if logprobs is not None and api.logprobs:
        return "logprobs"
    if api.stream_token_ids:
        return "token_ids"
    return "usage" if api.stream_usage else "text"


def is_chat(prompt: Prompt) -> bool:
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict)


def completion_path(body: dict) -> str:
    return "/v1/chat/completions" if "messages" in body else "/v1/completions"
