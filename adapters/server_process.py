"""An engine's own OpenAI-compatible server: what its API does, and its process.

- `ServerApi`: what a server's /v1/completions does where OpenAI's API leaves it open, declared by
  its adapter (prompt as token ids or text, how token ids come back, how prompt logprobs are asked
  for, whether EOS can be ignored, which sampling fields make a completion greedy and unpenalised).
- `ServerLaunch`: the command an adapter gives for its server, and the facts stored with its cells.
- `ServerProcess` starts that command on a free loopback port, in the worker's process group and
  dying with the worker (so a timeout's kill of the group takes the server and its children too),
  waits until its health path answers, and stops it.
- `completion_body` and the small HTTP helpers that the load generator, the output capture and
  `bench diff-endpoints` share.

It runs inside the worker (the framework's interpreter): httpx and psutil only, imported lazily.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
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


class ServerError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent() -> None:
    """In a child, before exec: the kernel kills it when its parent dies (it must not outlive it)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class ServerProcess:
    """One server child on 127.0.0.1:port. Its output goes to `log_path`."""

    def __init__(self, launch: ServerLaunch, port: int, log_path: str, startup_timeout_s: float = 600.0,
                 health_path: str = "/v1/models"):
        self.launch, self.port, self.log_path = launch, port, log_path
        self.startup_timeout_s, self.health_path = startup_timeout_s, health_path
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, chars: int = 3000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log_path) - chars))
                return f.read().decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def exit_description(self) -> str | None:
        code = self.proc.poll() if self.proc else None
        if code is None:
            return None
        return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"

    def start(self) -> "ServerProcess":
        import httpx

        log = open(self.log_path, "ab")
        # same process group as the worker (no new session): killing the worker's group kills the server
        self.proc = subprocess.Popen(self.launch.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=os.environ | self.launch.env, preexec_fn=die_with_parent)
        log.close()
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            how = self.exit_description()
            if how:
                raise ServerError(f"the server {how} before it answered GET {self.health_path}; "
                                  f"its last output:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + self.health_path, timeout=2.0, trust_env=False).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise ServerError(f"the server did not answer GET {self.health_path} within "
                                  f"{self.startup_timeout_s:g}s; its last output:\n{tail}")
            time.sleep(0.25)

    def pids(self) -> list[int]:
        return [self.proc.pid] if self.proc else []

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM to the server and its children, SIGKILL to whatever is left after the grace period."""
        import psutil

        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            procs = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.Error:
            procs = []
        for p in procs:
            try:
                p.terminate()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=grace_s)
        self.proc.poll()


def post(url: str, path: str, headers: dict | None = None, timeout_s: float = 30.0) -> None:
    import httpx

    httpx.post(url.rstrip("/") + path, headers=headers, timeout=timeout_s, trust_env=False).raise_for_status()


def get_json(url: str, path: str, headers: dict | None = None, timeout_s: float = 10.0) -> Any:
    import httpx

    r = httpx.get(url.rstrip("/") + path, headers=headers, timeout=timeout_s, trust_env=False)
    r.raise_for_status()
    return r.json()


def served_model_name(url: str, headers: dict | None = None) -> str | None:
    """The first model id GET /v1/models lists (what an already-running server expects in `model`)."""
    data = get_json(url, "/v1/models", headers).get("data") or []
    return data[0].get("id") if data else None


def completion_body(api: ServerApi, prompt: Prompt, max_tokens: int, seed: int, stream: bool, model: str | None,
                    logprobs: int | None = None, ignore_eos: bool = True, prompt_logprobs: bool = False) -> dict:
    chat = is_chat(prompt)
    if chat and (logprobs is not None or prompt_logprobs):
        raise ValueError("chat requests carry no logprobs here (the capture goes through /v1/completions)")
    body: dict[str, Any] = {"messages" if chat else "prompt": prompt, "max_tokens": max_tokens, "seed": seed,
                            "stream": stream, "temperature": 0.0, **api.greedy_fields}
    if model:
        body["model"] = model
    if stream:
        body["stream_options"] = {"include_usage": True, **({"continuous_usage_stats": True} if api.stream_usage else {})}
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


def is_chat(prompt: Prompt) -> bool:
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict)


def completion_path(body: dict) -> str:
    return "/v1/chat/completions" if "messages" in body else "/v1/completions"


def chat_prompt_tokens(url: str, api: ServerApi, messages: list[dict], model: str | None = None,
                       headers: dict | None = None, timeout_s: float = 60.0) -> tuple[list[int] | None, int | None, str]:
    """How the server renders a chat's messages: (its prompt ids where it can say, its prompt token count,
    how it was asked). A server whose tokenizer endpoint takes messages (vLLM's /tokenize, the same
    renderer as its chat endpoint) gives the ids without running the model; any other gives the count
    in the usage of a one-token, non-streamed /v1/chat/completions (one prefill)."""
    import httpx

    if api.chat_tokenize and api.tokenize_path:
        r = httpx.post(url.rstrip("/") + api.tokenize_path, json={"model": model, "messages": messages,
                       "add_generation_prompt": True}, headers=headers, timeout=timeout_s, trust_env=False)
        r.raise_for_status()
        ids = r.json().get("tokens")
        return ids, len(ids), api.tokenize_path
    body = completion_body(api, messages, 1, 0, False, model, ignore_eos=False)
    r = httpx.post(url.rstrip("/") + "/v1/chat/completions", json=body, headers=headers, timeout=timeout_s,
                   trust_env=False)
    r.raise_for_status()
    return None, (r.json().get("usage") or {}).get("prompt_tokens"), "the usage of a 1-token /v1/chat/completions"


def tokenize_remote(url: str, api: ServerApi, text: str, model: str | None = None,
                    headers: dict | None = None, timeout_s: float = 30.0) -> list[int] | None:
    """The server's own tokenization of a text prompt, where it has a tokenizer endpoint."""
    import httpx

    if not api.tokenize_path:
        return None
    body = {"input": text} if api.tokenize_path == "/extras/tokenize" else {"prompt": text, "model": model}
    try:
        r = httpx.post(url.rstrip("/") + api.tokenize_path, json=body, headers=headers, timeout=timeout_s,
                       trust_env=False)
    except httpx.HTTPError:
        return None
    return r.json().get("tokens") if r.status_code == 200 else None
