"""Serving mode: drive an OpenAI-compatible /v1/completions server with load, and capture its outputs.

- `LlamaCppServer` starts llama-cpp-python's server (`python -m llama_cpp.server`) on a free loopback port
  as a child process in its own process group, waits until GET /v1/models answers, and stops it (SIGTERM
  to the group, then SIGKILL). An already-running server is targeted by URL instead (`endpoint`): nothing
  is started or stopped then.
- `run_load` sends streaming completions (temperature 0, fixed seed, fixed max_tokens) under one load
  profile: a fixed concurrency (closed loop), or a constant / Poisson request rate (open loop). Every
  profile is bounded by a request count and a time limit. Per request it records client-side TTFT (the
  first streamed chunk that carries a token), the inter-token gaps and the end-to-end latency. Errors,
  per-request timeouts, requests cut at the time limit and requests never sent are counted, never dropped.
- `summarize` turns the results into percentiles, throughput and goodput against TTFT/TPOT SLOs.
- `capture_rows` asks for greedy completions with logprobs and turns them into rows of the logprobs table
  (kind "generation").
- `diff_endpoints` sends the same prompts to two servers N times at temperature 0 and reports which
  outputs differ and where they first differ.

What llama-cpp-python 0.3.36's server does and does not do (read from its source, checked against it):
- /v1/completions takes `prompt` as a string (or a list of one string) only: a list of token ids is a 422.
  Prompts are therefore sent as text; its token ids are what the server's /extras/tokenize returns.
  A prompt given here as a list of ints is sent as it is (vLLM and others accept that).
- `logprobs: k` returns, per generated token, the token *string*, its logprob and a dict string -> logprob
  of the k most likely tokens (plus the chosen one). No token ids: they are mapped back through the
  model's vocabulary (id -> detokenized string, the same function the server uses); strings that several
  ids share are ambiguous and get id -1, counted in a note.
- Its sampler defaults are not greedy-neutral: repeat_penalty defaults to 1.1, so every request here sends
  repeat_penalty 1.0, presence/frequency penalties 0, top_k 0, top_p 1, min_p 0.
- It serves one request at a time (a lock around the single Llama), and by default
  (`interrupt_requests`) ends a running stream early as soon as another request waits: concurrency > 1
  then truncates streams. The server started here passes `--interrupt_requests False`; for a given
  endpoint, a stream that ends with fewer tokens than asked and no finish_reason "stop"/"length" is
  counted as an error ("truncated").
- EOS cannot be ignored through the API: a completion may end early with finish_reason "stop".
- Streamed chunks carry no usage; `stream_options.include_usage` is sent, and used where a server honours
  it (vLLM does). Otherwise a request's token count is the number of streamed chunks that carry a token
  (llama-cpp-python sends one chunk per token unless a token ends in the middle of a UTF-8 character).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence, Union

import numpy as np

Prompt = Union[str, list[int]]

# GGML type ids of KV cache types, as llama_cpp.server's --type_k/--type_v take them
_KV_TYPE_IDS = {"f32": 0, "f16": 1, "bf16": 30, "q8_0": 8, "q5_1": 7, "q5_0": 6, "q4_1": 3, "q4_0": 2, "iq4_nl": 20}

# sampling fields that make llama-cpp-python's completion greedy and unpenalised
GREEDY_FIELDS = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0,
                 "presence_penalty": 0.0, "frequency_penalty": 0.0}


def server_available() -> str | None:
    """Why llama-cpp-python's server cannot run in this interpreter, or None when it can."""
    try:
        import httpx  # noqa: F401
        import llama_cpp.server.app  # noqa: F401
    except Exception as err:  # ImportError, or a missing extra raising something else on import
        return (f"llama_cpp.server is not importable ({type(err).__name__}: {err}); "
                "install it with: pip install -e '.[serve]'")
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------------------------------
# server lifecycle


class ServerError(RuntimeError):
    pass


class LlamaCppServer:
    """llama-cpp-python's OpenAI server on one GGUF, as a child process group on 127.0.0.1."""

    def __init__(self, model: str | os.PathLike, *, n_threads: int = 1, n_ctx: int = 512,
                 type_k: str | None = "f32", type_v: str | None = "f32", flash_attn: bool = False,
                 seed: int = 0, extra_args: Sequence[str] = (), python: str = sys.executable,
                 log_path: str | os.PathLike | None = None, startup_timeout_s: float = 120.0):
        self.model = str(model)
        self.args = ["--model", self.model, "--host", "127.0.0.1", "--n_threads", str(n_threads),
                     "--n_threads_batch", str(n_threads), "--n_ctx", str(n_ctx), "--seed", str(seed),
                     "--flash_attn", str(bool(flash_attn)), "--interrupt_requests", "False"]
        if type_k:
            self.args += ["--type_k", str(_KV_TYPE_IDS[type_k])]
        if type_v:
            self.args += ["--type_v", str(_KV_TYPE_IDS[type_v])]
        self.args += list(extra_args)
        self.python = python
        self.log_path = Path(log_path) if log_path else None
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self._log = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def engine_args(self) -> dict[str, Any]:
        return {"command": [self.python, "-m", "llama_cpp.server", *self.args, "--port", str(self.port)]}

    def log_tail(self, n: int = 20) -> str:
        if self.log_path and self.log_path.exists():
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        return ""

    def start(self) -> "LlamaCppServer":
        import httpx

        if self.log_path is None:
            import tempfile
            fd, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        self.port = free_port()
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([self.python, "-m", "llama_cpp.server", *self.args, "--port", str(self.port)],
                                     stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            if self.proc.poll() is not None:
                tail = self.log_tail()
                self.stop()
                raise ServerError(f"llama_cpp.server exited with code {self.proc.returncode} before it answered:\n{tail}")
            try:
                r = httpx.get(self.url + "/v1/models", timeout=2.0)
                if r.status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise ServerError(f"llama_cpp.server did not answer GET /v1/models within "
                                  f"{self.startup_timeout_s:.0f}s:\n{tail}")
            time.sleep(0.25)

    def stop(self, grace_s: float = 10.0) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=grace_s)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> "LlamaCppServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# --------------------------------------------------------------------------------------------------
# load generation


@dataclass
class LoadProfile:
    """One load point. kind "concurrency": `concurrency` requests in flight (closed loop); kind "rate":
    requests sent at `rate` per second (open loop), evenly spaced or with Poisson (exponential) gaps."""

    kind: Literal["concurrency", "rate"] = "concurrency"
    concurrency: int = 1
    rate: float = 1.0
    poisson: bool = False
    requests: int = 8                  # at most this many requests
    time_limit_s: float = 60.0         # and no request sent or still running after this

    @property
    def name(self) -> str:
        if self.kind == "concurrency":
            return f"concurrency={self.concurrency}"
        return f"{'poisson' if self.poisson else 'constant'}-rate={self.rate:g}/s"


@dataclass
class RequestResult:
    index: int
    prompt_index: int
    start: float = 0.0                        # perf_counter when sent
    first_token: float | None = None
    token_times: list[float] = field(default_factory=list)
    end: float | None = None
    text: str = ""
    output_tokens: int = 0                    # usage.completion_tokens when streamed, else token chunks
    usage_tokens: int | None = None
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None                  # None when ok
    error_kind: str | None = None             # http, timeout, time_limit, connection, truncated, protocol

    @property
    def ok(self) -> bool:
        return self.error is None


def completion_body(prompt: Prompt, max_tokens: int, seed: int, stream: bool, logprobs: int | None = None,
                    model: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "seed": seed, "stream": stream,
                            **GREEDY_FIELDS}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if logprobs is not None:
        body["logprobs"] = logprobs
    if model:
        body["model"] = model
    return body


async def _stream_one(client, url: str, body: dict, res: RequestResult) -> None:
    import httpx

    res.start = time.perf_counter()
    try:
        async with client.stream("POST", url.rstrip("/") + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                res.error, res.error_kind = f"HTTP {r.status_code}: {text[:300]}", "http"
                return
            done = False
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue              # blank separators, ": ping" comments
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                try:
                    chunk = json.loads(data)
                except json.JSONDecodeError:
                    res.error, res.error_kind = f"bad stream line: {data[:200]}", "protocol"
                    return
                if chunk.get("usage"):
                    res.usage_tokens = chunk["usage"].get("completion_tokens")
                    res.prompt_tokens = chunk["usage"].get("prompt_tokens", res.prompt_tokens)
                for choice in chunk.get("choices") or []:
                    text = choice.get("text") or ""
                    finish = choice.get("finish_reason")
                    lp = choice.get("logprobs") or {}
                    n_tok = len(lp.get("tokens") or []) or (1 if (finish is None or text) else 0)
                    if n_tok:
                        now = time.perf_counter()
                        if res.first_token is None:
                            res.first_token = now
                        res.token_times.extend([now] * n_tok)
                        res.output_tokens += n_tok
                    res.text += text
                    if finish:
                        res.finish_reason = finish
            res.end = time.perf_counter()
            if res.usage_tokens is not None:
                res.output_tokens = res.usage_tokens
            if not done or res.finish_reason is None:
                res.error = (f"stream ended without {'[DONE]' if not done else 'a finish_reason'} after "
                             f"{res.output_tokens} tokens")
                res.error_kind = "truncated"
            elif res.finish_reason not in ("stop", "length"):
                res.error, res.error_kind = f"finish_reason {res.finish_reason!r}", "truncated"
            elif res.finish_reason == "length" and res.output_tokens < body["max_tokens"]:
                res.error = f"finish_reason 'length' after {res.output_tokens} < max_tokens {body['max_tokens']} tokens"
                res.error_kind = "truncated"
    except httpx.TimeoutException as err:
        res.error, res.error_kind = f"request timeout ({type(err).__name__})", "timeout"
    except httpx.HTTPError as err:
        res.error, res.error_kind = f"{type(err).__name__}: {err}", "connection"


async def _bounded(coro, res: RequestResult, deadline: float) -> None:
    """Run one request; one still running at the profile's time limit is cancelled and counted."""
    remaining = deadline - time.perf_counter()
    try:
        await asyncio.wait_for(coro, timeout=max(remaining, 0.001))
    except asyncio.TimeoutError:
        if res.error is None:
            res.error, res.error_kind = "still running at the profile's time limit", "time_limit"
    if res.end is None:
        res.end = time.perf_counter()


async def run_load_async(url: str, prompts: Sequence[Prompt], profile: LoadProfile, *, max_tokens: int = 16,
                         seed: int = 0, request_timeout_s: float = 60.0, model: str | None = None,
                         prompt_tokens: Sequence[int] | None = None) -> dict[str, Any]:
    """Send up to profile.requests streaming completions (prompts cycled) under the profile.
    `prompt_tokens` (per prompt) fills a request's prompt length where the stream reports no usage.
    Returns {"profile", "results": [RequestResult...], "start", "end", "not_sent"}."""
    import httpx

    if not prompts:
        raise ValueError("no prompts")
    n = profile.requests
    limits = httpx.Limits(max_connections=max(profile.concurrency, 8) + 4, max_keepalive_connections=32)
    results: list[RequestResult] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(request_timeout_s, connect=10.0), limits=limits,
                                 trust_env=False) as client:
        start = time.perf_counter()
        deadline = start + profile.time_limit_s

        def make(i: int):
            res = RequestResult(index=i, prompt_index=i % len(prompts))
            if prompt_tokens is not None:
                res.prompt_tokens = prompt_tokens[res.prompt_index]
            results.append(res)
            body = completion_body(prompts[res.prompt_index], max_tokens, seed, stream=True, model=model)
            return _bounded(_stream_one(client, url, body, res), res, deadline)

        if profile.kind == "concurrency":
            counter = iter(range(n))

            async def worker():
                for i in counter:
                    if time.perf_counter() >= deadline:
                        return
                    await make(i)

            await asyncio.gather(*(worker() for _ in range(max(1, profile.concurrency))))
        else:
            rng = random.Random(seed)
            tasks = []
            t_next = start
            for i in range(n):
                delay = t_next - time.perf_counter()
                if t_next >= deadline:
                    break
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(make(i)))
                t_next += rng.expovariate(profile.rate) if profile.poisson else 1.0 / profile.rate
            if tasks:
                await asyncio.gather(*tasks)
        end = time.perf_counter()
    return {"profile": profile, "results": sorted(results, key=lambda r: r.index), "start": start, "end": end,
            "not_sent": n - len(results)}


def run_load(url: str, prompts: Sequence[Prompt], profile: LoadProfile, **kwargs) -> dict[str, Any]:
    return asyncio.run(run_load_async(url, prompts, profile, **kwargs))


def _pcts(values: list[float], prefix: str) -> dict[str, float | None]:
    arr = np.asarray(values, dtype=np.float64)
    return {f"{prefix}_p{q}": (float(np.percentile(arr, q)) if arr.size else None) for q in (50, 90, 99)}


def summarize(run: dict[str, Any], ttft_slo_ms: float | None = None, tpot_slo_ms: float | None = None) -> dict[str, Any]:
    """Latency percentiles (ms) over the ok requests, throughput over the profile's wall time, goodput over
    every request the profile meant to send (errors and requests not sent never meet an SLO)."""
    results: list[RequestResult] = run["results"]
    ok = [r for r in results if r.ok and r.first_token is not None]
    ttft = [(r.first_token - r.start) * 1e3 for r in ok]
    e2e = [(r.end - r.start) * 1e3 for r in ok]
    tpot, itl = [], []
    for r in ok:
        if r.output_tokens > 1 and r.token_times:
            tpot.append((r.token_times[-1] - r.first_token) * 1e3 / (r.output_tokens - 1))
        itl.extend((np.diff(r.token_times) * 1e3).tolist())
    elapsed = max(run["end"] - run["start"], 1e-9)
    out_tokens = sum(r.output_tokens for r in ok)
    prompt_tokens = sum(r.prompt_tokens or 0 for r in ok)
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            errors[r.error_kind or "error"] = errors.get(r.error_kind or "error", 0) + 1
    planned = len(results) + run["not_sent"]
    good = 0
    for r in ok:
        t = (r.first_token - r.start) * 1e3
        p = (r.token_times[-1] - r.first_token) * 1e3 / (r.output_tokens - 1) if r.output_tokens > 1 else 0.0
        if (ttft_slo_ms is None or t <= ttft_slo_ms) and (tpot_slo_ms is None or p <= tpot_slo_ms):
            good += 1
    profile: LoadProfile = run["profile"]
    summary = {"profile": profile.name, **{f"profile_{k}": v for k, v in asdict(profile).items()},
               "planned": planned, "sent": len(results), "ok": len(ok), "errors": sum(errors.values()),
               "errors_by_kind": errors, "not_sent": run["not_sent"],
               "first_errors": [r.error for r in results if not r.ok][:3],
               "duration_s": elapsed, "output_tokens": out_tokens, "output_tok_s": out_tokens / elapsed,
               "total_tok_s": (out_tokens + prompt_tokens) / elapsed, "req_s": len(ok) / elapsed,
               "ttft_slo_ms": ttft_slo_ms, "tpot_slo_ms": tpot_slo_ms,
               "goodput": good / planned if planned else None, "goodput_req_s": good / elapsed,
               "ttft_ms": ttft, "tpot_ms": tpot, "e2e_ms": e2e}
    for name, values in (("ttft_ms", ttft), ("tpot_ms", tpot), ("itl_ms", itl), ("e2e_ms", e2e)):
        summary.update(_pcts(values, name))
    return summary


# --------------------------------------------------------------------------------------------------
# output capture


def _complete(client, url: str, prompt: Prompt, max_tokens: int, seed: int, logprobs: int | None,
              model: str | None = None) -> dict[str, Any]:
    r = client.post(url.rstrip("/") + "/v1/completions",
                    json=completion_body(prompt, max_tokens, seed, stream=False, logprobs=logprobs, model=model))
    r.raise_for_status()
    return r.json()


class VocabMap:
    """Token string -> token id, built from a GGUF's vocabulary exactly as llama-cpp-python's server
    renders tokens in logprobs (detokenize one id, decode UTF-8 ignoring errors). Strings shared by
    several ids are ambiguous (-1)."""

    def __init__(self, gguf_path: str | os.PathLike):
        import llama_cpp

        from adapters.gguf_convert import captured_llama_logs

        with captured_llama_logs([]):
            llm = llama_cpp.Llama(str(gguf_path), vocab_only=True, verbose=False)
        self.n_vocab = llm.n_vocab()
        ids: dict[str, list[int]] = {}
        for i in range(self.n_vocab):
            ids.setdefault(llm.detokenize([i]).decode("utf-8", errors="ignore"), []).append(i)
        self.ids = {s: (v[0] if len(v) == 1 else -1) for s, v in ids.items()}
        self.ambiguous = sum(1 for v in ids.values() if len(v) > 1)
        llm.close()

    def id(self, token: str) -> int:
        return self.ids.get(token, -1)


def tokenize_remote(url: str, text: str, timeout_s: float = 30.0) -> list[int] | None:
    """The server's own tokenization (llama-cpp-python's /extras/tokenize), None where it has none."""
    import httpx

    try:
        r = httpx.post(url.rstrip("/") + "/extras/tokenize", json={"input": text}, timeout=timeout_s, trust_env=False)
    except httpx.HTTPError:
        return None
    return r.json().get("tokens") if r.status_code == 200 else None


def capture_rows(url: str, prompts: Sequence[Prompt], *, max_tokens: int, top_k: int = 5, seed: int = 0,
                 repeats: int = 1, vocab: VocabMap | None = None, run_id: str = "", cell_id: str = "",
                 timeout_s: float = 60.0, model: str | None = None) -> tuple[Any, list[str], list[dict]]:
    """Greedy completions with logprobs -> (pyarrow table in LOGPROBS_SCHEMA, notes, raw completions).
    A row's position is prompt_tokens + j (usage.prompt_tokens); token ids come from the server where it
    returns them, else through `vocab` (token strings -> ids), else -1."""
    import httpx
    import pyarrow as pa

    from orchestrator.store import LOGPROBS_SCHEMA

    rows: dict[str, list] = {n: [] for n in LOGPROBS_SCHEMA.names}
    notes: list[str] = []
    raw: list[dict] = []
    unmapped = 0
    no_logprobs = 0
    with httpx.Client(timeout=timeout_s, trust_env=False) as client:
        for repeat in range(repeats):
            for pi, prompt in enumerate(prompts):
                resp = _complete(client, url, prompt, max_tokens, seed, top_k, model=model)
                raw.append({"repeat": repeat, "prompt_index": pi, **resp})
                choice = resp["choices"][0]
                lp = choice.get("logprobs")
                if not lp:
                    no_logprobs += 1
                    continue
                n_prompt = (resp.get("usage") or {}).get("prompt_tokens") or 0
                ids = lp.get("token_ids")      # some servers return ids; llama-cpp-python does not
                for j, tok in enumerate(lp.get("tokens") or []):
                    tid = int(ids[j]) if ids else (vocab.id(tok) if vocab else -1)
                    unmapped += tid < 0
                    top = (lp.get("top_logprobs") or [None] * (j + 1))[j] or {}
                    pairs = sorted(((vocab.id(s) if vocab else -1, float(v)) for s, v in top.items()),
                                   key=lambda p: (-p[1], p[0]))[:top_k]
                    rows["run_id"].append(run_id)
                    rows["cell_id"].append(cell_id)
                    rows["kind"].append("generation")
                    rows["repeat"].append(repeat)
                    rows["prompt_index"].append(pi)
                    rows["position"].append(n_prompt + j)
                    rows["token_id"].append(tid)
                    tlp = (lp.get("token_logprobs") or [None] * (j + 1))[j]
                    rows["logprob"].append(float(tlp) if tlp is not None else float("nan"))
                    rows["topk_ids"].append([p[0] for p in pairs])
                    rows["topk_logprobs"].append([p[1] for p in pairs])
    if vocab is not None:
        notes.append("the server returns token strings, not ids: token ids mapped through the model's vocabulary "
                     f"(id -> detokenized string; {vocab.ambiguous} strings are shared by several ids and map to -1)")
    if unmapped:
        notes.append(f"{unmapped} generated tokens could not be mapped to one token id (token_id -1)")
    if no_logprobs:
        notes.append(f"{no_logprobs} completions came back without logprobs (the server does not offer them)")
    notes.append("the server's top_logprobs are its top-k plus the chosen token, keyed by token string: "
                 "top-k ids come from those strings, ties broken by the lower id")
    return pa.Table.from_pydict(rows, schema=LOGPROBS_SCHEMA), notes, raw


# --------------------------------------------------------------------------------------------------
# diff-endpoints


def read_prompts(path: str | os.PathLike) -> list[str]:
    """Text lines (blank lines skipped), or JSONL with a "prompt" field per line."""
    out = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                out.append(json.loads(line)["prompt"])
                continue
            except (json.JSONDecodeError, KeyError):
                pass
        out.append(line)
    return out


@dataclass
class Output:
    text: str
    tokens: list[str] | None          # token strings where the server returned logprobs
    finish_reason: str | None
    completion_tokens: int | None


def _first_divergence(a: Output, b: Output) -> dict[str, Any] | None:
    """None when equal; else the first differing token index (where both have tokens) and char index."""
    if a.text == b.text and (a.tokens is None or b.tokens is None or a.tokens == b.tokens):
        return None
    char = next((i for i, (x, y) in enumerate(zip(a.text, b.text)) if x != y), min(len(a.text), len(b.text)))
    tok = None
    if a.tokens is not None and b.tokens is not None:
        tok = next((i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y),
                   min(len(a.tokens), len(b.tokens)))
        char = len("".join(a.tokens[:tok]))
    lo = max(0, char - 20)
    return {"token_index": tok, "char_index": char, "a_context": a.text[lo:char + 30], "b_context": b.text[lo:char + 30]}


def fetch_outputs(url: str, prompts: Sequence[Prompt], repeats: int, max_tokens: int, seed: int = 0,
                  timeout_s: float = 120.0, model: str | None = None) -> list[list[Output]]:
    """outputs[prompt][repeat]: greedy completions, with logprobs=1 for the token strings."""
    import httpx

    out: list[list[Output]] = [[] for _ in prompts]
    with httpx.Client(timeout=timeout_s, trust_env=False) as client:
        for _ in range(repeats):
            for i, p in enumerate(prompts):
                resp = _complete(client, url, p, max_tokens, seed, logprobs=1, model=model)
                c = resp["choices"][0]
                lp = c.get("logprobs") or {}
                out[i].append(Output(text=c.get("text") or "", tokens=lp.get("tokens"),
                                     finish_reason=c.get("finish_reason"),
                                     completion_tokens=(resp.get("usage") or {}).get("completion_tokens")))
    return out


def diff_endpoints(url_a: str, url_b: str, prompts: Sequence[Prompt], repeats: int = 2, max_tokens: int = 32,
                   seed: int = 0, timeout_s: float = 120.0) -> dict[str, Any]:
    """Shares of differing outputs: within A's repeats and B's (each repeat against repeat 0), and A vs B
    (repeat r of A against repeat r of B); every differing pair with where it first differs."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    outs = {"A": fetch_outputs(url_a, prompts, repeats, max_tokens, seed, timeout_s),
            "B": fetch_outputs(url_b, prompts, repeats, max_tokens, seed, timeout_s)}
    report: dict[str, Any] = {"endpoints": {"A": url_a, "B": url_b}, "prompts": len(prompts), "repeats": repeats,
                              "max_tokens": max_tokens, "comparisons": {}, "differences": []}
    for name, pairs in (("within A", [("A", i, 0, "A", i, r) for i in range(len(prompts)) for r in range(1, repeats)]),
                        ("within B", [("B", i, 0, "B", i, r) for i in range(len(prompts)) for r in range(1, repeats)]),
                        ("A vs B", [("A", i, r, "B", i, r) for i in range(len(prompts)) for r in range(repeats)])):
        differing = 0
        for ea, i, ra, eb, _, rb in pairs:
            d = _first_divergence(outs[ea][i][ra], outs[eb][i][rb])
            if d is not None:
                differing += 1
                report["differences"].append({"comparison": name, "prompt_index": i, "a": f"{ea}[{ra}]",
                                              "b": f"{eb}[{rb}]", **d})
        report["comparisons"][name] = {"pairs": len(pairs), "differing": differing,
                                       "share": differing / len(pairs) if pairs else None}
    report["token_strings"] = all(o.tokens is not None for e in outs.values() for po in e for o in po)
    return report


def format_diff_report(report: dict[str, Any], limit: int = 20) -> str:
    lines = [f"A = {report['endpoints']['A']}", f"B = {report['endpoints']['B']}",
             f"{report['prompts']} prompts x {report['repeats']} repeats, max_tokens {report['max_tokens']}, temperature 0"]
    for name, c in report["comparisons"].items():
        share = "n/a (one repeat)" if c["share"] is None else f"{c['share']:.1%}"
        lines.append(f"  {name:9s} differing outputs: {c['differing']}/{c['pairs']} ({share})")
    diffs = report["differences"]
    if diffs:
        lines.append("first divergence (token index; text around it):")
        for d in diffs[:limit]:
            where = f"token {d['token_index']}" if d["token_index"] is not None else f"char {d['char_index']}"
            lines.append(f"  [{d['comparison']}] prompt {d['prompt_index']} {d['a']} vs {d['b']}: {where}")
            lines.append(f"      {d['a']}: {d['a_context']!r}")
            lines.append(f"      {d['b']}: {d['b_context']!r}")
        if len(diffs) > limit:
            lines.append(f"  ... and {len(diffs) - limit} more")
    return "\n".join(lines)
