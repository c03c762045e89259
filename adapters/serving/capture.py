"""Output capture through a server's OpenAI API: greedy completions with logprobs, as TokenScores.

`capture` asks for greedy completions with logprobs (and teacher-forced prompt logprobs where the
server offers them) and returns `TokenScores` by token id under the one top-k rule of
`adapters.contract`, as the offline adapters do, so served and offline cells land in the same
logprobs table and compare position by position.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Callable, Sequence

from adapters.contract.openai_api import Prompt, ServerApi, completion_body
from adapters.contract.records import TokenScores, topk_sparse
from adapters.serving.server_process import ServerError


def _token_id(token: str, api: ServerApi, to_id: Callable[[str], int] | None) -> int:
    if api.ids_in_logprobs and token.startswith("token_id:"):
        return int(token[len("token_id:"):])
    return to_id(token) if to_id else -1


def _openai_rows(lp: dict, api: ServerApi, to_id, lo: int, hi: int | None = None) -> list:
    """Rows lo..hi of an OpenAI `logprobs` object (tokens, token_logprobs, top_logprobs)."""
    tokens = lp.get("tokens") or []
    hi = len(tokens) if hi is None else hi
    token_lps, tops = lp.get("token_logprobs") or [], lp.get("top_logprobs") or []
    rows = []
    for j in range(lo, hi):
        tlp = token_lps[j] if j < len(token_lps) else None
        top = (tops[j] if j < len(tops) else None) or {}
        rows.append((_token_id(tokens[j], api, to_id), math.nan if tlp is None else float(tlp),
                     [(_token_id(s, api, to_id), float(v)) for s, v in top.items()]))
    return rows


def _vllm_prompt_rows(plps: list, prompt_ids: list[int]) -> list:
    """vLLM's `prompt_logprobs`: per prompt position None (the first) or {id: {logprob, rank, ...}}."""
    rows = []
    for pos, tid in zip(plps[1:], prompt_ids[1:]):
        pos = {int(k): (v["logprob"] if isinstance(v, dict) else float(v)) for k, v in (pos or {}).items()}
        rows.append((tid, float(pos.get(tid, math.nan)), list(pos.items())))
    return rows


@dataclass
class Captured:
    """One scoring prompt as the server answered it."""

    prompt_ids: list[int]            # the prompt as the server tokenized it
    prompt: TokenScores | None       # teacher-forced rows (scores of prompt tokens 1..n-1), where offered
    generation: TokenScores          # greedy rows
    usage: dict
    finish_reason: str | None


def _capture_one(resp: dict, api: ServerApi, to_id, prompt_ids: list[int] | None, k: int,
                 want_prompt: bool) -> Captured:
    choice = resp["choices"][0]
    lp = choice.get("logprobs") or {}
    usage = resp.get("usage") or {}
    n_prompt = usage.get("prompt_tokens")
    prompt_rows = None
    if want_prompt and api.prompt_logprobs == "prompt_logprobs" and choice.get("prompt_logprobs") is not None:
        ids = list(prompt_ids) if prompt_ids is not None else [int(t) for t in resp.get("prompt_token_ids") or []]
        prompt_rows = _vllm_prompt_rows(choice["prompt_logprobs"], ids)
        gen_rows = _openai_rows(lp, api, to_id, 0)
    elif want_prompt and api.prompt_logprobs == "echo":
        # echo: the prompt's tokens come first (the first has no logprob), then the generated ones
        n_prompt = n_prompt if n_prompt is not None else len(prompt_ids or [])
        prompt_rows = _openai_rows(lp, api, to_id, 1, n_prompt)
        gen_rows = _openai_rows(lp, api, to_id, n_prompt)
        if prompt_ids is None:
            prompt_ids = [_token_id(t, api, to_id) for t in (lp.get("tokens") or [])[:n_prompt]]
    else:
        gen_rows = _openai_rows(lp, api, to_id, 0)
    if prompt_ids is None:
        prompt_ids = []
    if prompt_rows is not None:   # a teacher-forced row scores the prompt's own token at that position
        prompt_rows = [(tid, lp_, pairs) for (_, lp_, pairs), tid in zip(prompt_rows, prompt_ids[1:])]
    return Captured(prompt_ids=list(prompt_ids), prompt=topk_sparse(prompt_rows, k) if prompt_rows is not None else None,
                    generation=topk_sparse(gen_rows, k), usage=usage, finish_reason=choice.get("finish_reason"))


async def _capture_async(url: str, api: ServerApi, prompts: Sequence[Prompt], prompt_ids: Sequence[list[int] | None],
                         *, max_tokens: int, top_k: int, concurrency: int, seed: int, model: str | None,
                         to_id, headers: dict | None, timeout_s: float, want_prompt: bool) -> list[Captured]:
    import httpx

    out: list[Captured | None] = [None] * len(prompts)
    slots = asyncio.Semaphore(max(1, concurrency))
    async with httpx.AsyncClient(timeout=timeout_s, headers=headers, trust_env=False) as client:
        async def one(i: int) -> None:
            body = completion_body(api, prompts[i], max_tokens, seed, False, model, logprobs=top_k,
                                   prompt_logprobs=want_prompt)
            async with slots:
                r = await client.post(url.rstrip("/") + "/v1/completions", json=body)
            if r.status_code != 200:
                raise ServerError(f"capture request {i}: HTTP {r.status_code}: {r.text[:500]}")
            out[i] = _capture_one(r.json(), api, to_id, prompt_ids[i], top_k, want_prompt)

        await asyncio.gather(*(one(i) for i in range(len(prompts))))
    return out  # type: ignore[return-value]


def capture(url: str, api: ServerApi, prompts: Sequence[Prompt], prompt_ids: Sequence[list[int] | None], *,
            max_tokens: int, top_k: int, concurrency: int = 1, seed: int = 0, model: str | None = None,
            to_id: Callable[[str], int] | None = None, headers: dict | None = None, timeout_s: float = 120.0,
            want_prompt: bool = True) -> list[Captured]:
    """Greedy completions with logprobs (and prompt logprobs where offered), `concurrency` at a time.
    `prompt_ids[i]` is prompt i as token ids where known (sent as ids, or checked against the server's
    tokenizer); None: taken from the server's answer."""
    return asyncio.run(_capture_async(url, api, prompts, prompt_ids, max_tokens=max_tokens, top_k=top_k,
                                      concurrency=concurrency, seed=seed, model=model, to_id=to_id,
                                      headers=headers, timeout_s=timeout_s, want_prompt=want_prompt))
