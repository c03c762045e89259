"""The timing types every adapter and the load generator fill (`RequestTiming`, `TimedRun`) and the
one function that turns them into every latency, throughput and goodput figure (`summarize`).

Where each figure is taken, per adapter and mode, is written in results/README.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Sequence

import numpy as np
from pydantic import Field

from adapters.contract.specs import ContractModel


@dataclass
class RequestTiming:
    """One request, on the calling process's clock (time.perf_counter seconds).

    `chunk_times[i]` is when output chunk i became available to the process that called the engine
    (offline: the step's tokens returned or were handed to our callback; served: the client received
    the SSE chunk), and `chunk_tokens[i]` how many tokens it carried. Empty: the times were not measured,
    and `missing` in the run says why."""

    sent: float                               # handed to the engine / sent to the server
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    output_tokens: int = 0                    # the authoritative count (a server's usage where it gives one)
    prompt_tokens: int | None = None
    end: float | None = None                  # the call or the stream ended
    scheduled: float | None = None            # served: its arrival time (queue = sent - scheduled)
    engine_ttft_s: float | None = None        # the engine's own TTFT figure, stored beside ours
    finish_reason: str | None = None
    error: str | None = None                  # None when ok
    error_kind: str | None = None             # http, timeout, time_limit, connection, truncated, protocol

    @property
    def ok(self) -> bool:
        return self.error is None

    def add_chunk(self, now: float, tokens: int) -> None:
        if tokens > 0:
            self.chunk_times.append(now)
            self.chunk_tokens.append(tokens)


@dataclass
class TimedRun:
    """One timed batch (offline) or one timed run of a load point (served)."""

    start: float
    end: float
    requests: list[RequestTiming]
    not_sent: int = 0                         # served: requests the time limit left unsent
    missing: dict[str, str] = field(default_factory=dict)   # figure -> why it was not measured


def per_token_run(start: float, end: float, token_times: Sequence[Sequence[float]], prompts: Sequence[Sequence[int]],
                  engine_ttft_s: Sequence[float | None] | None = None) -> TimedRun:
    """An offline batch whose tokens each became available on their own (one chunk per token), all
    requests handed to the engine at `start`."""
    return TimedRun(start=start, end=end, requests=[
        RequestTiming(sent=start, chunk_times=list(times), chunk_tokens=[1] * len(times), output_tokens=len(times),
                      prompt_tokens=len(p), end=end, engine_ttft_s=engine_ttft_s[i] if engine_ttft_s else None)
        for i, (times, p) in enumerate(zip(token_times, prompts))])


PERCENTILES = (50, 90, 99)


_PER_RUN = ("ttft_ms_p50_runs", "ttft_ms_p99_runs", "tpot_ms_p50_runs", "tpot_ms_p99_runs")


LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms")


# our TTFT and the engine's own agree when within this many ms, or this share of ours, whichever is larger
ENGINE_TTFT_MARGIN_MS = 1.0


ENGINE_TTFT_MARGIN_REL = 0.10


# A whole number the cells table stores in 32 bits (counts of requests and runs); any other int is 64-bit.
# The store derives each column's type from these annotations (orchestrator/store/schema.py).
Int32 = Annotated[int, "int32"]


class CellMetrics(ContractModel):
    """Every speed figure of one cell, from `summarize`. A null figure has its reason in `missing`."""

    requests: Int32                             # ok timed requests
    requests_planned: Int32
    requests_sent: Int32
    errors: Int32
    errors_by_kind: dict[str, int]            # error kind -> count
    output_tokens: int
    prompt_tokens: int | None
    output_tok_s: float | None                # mean over runs of (output tokens / run wall time)
    total_tok_s: float | None
    req_s: float | None
    output_tok_s_runs: list[float]
    goodput: float | None                     # share of planned requests within every per-request SLO
    goodput_req_s: float | None
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    slo_e2e_ms: float | None = None
    ttft_ms: list[float]                      # per request (null entries never: unmeasured requests are left out)
    tpot_ms: list[float]
    e2e_ms: list[float]
    ttft_ms_p50_runs: list[float] = Field(default_factory=list)   # per timed run: what cross-run intervals use
    ttft_ms_p99_runs: list[float] = Field(default_factory=list)
    tpot_ms_p50_runs: list[float] = Field(default_factory=list)
    tpot_ms_p99_runs: list[float] = Field(default_factory=list)
    # served arrivals (not a closed loop): each sent request's planned arrival and the time the client sent it,
    # ms after its run's start, in the order they were planned, run after run (the send minus the plan: queue_ms)
    scheduled_ms: list[float] = Field(default_factory=list)
    sent_ms: list[float] = Field(default_factory=list)
    chunk_tokens_mean: float | None           # tokens per output chunk: 1.0 means every ITL sample is one token
    itl_samples: int                          # ITL gaps: over the measured requests, chunks - 1 each
    engine_ttft_ms: list[float] | None
    engine_ttft_ms_p50: float | None
    engine_ttft_agrees: bool | None           # |p50 ours - p50 engine's| within the stated margin
    ttft_ms_p50: float | None = None
    ttft_ms_p90: float | None = None
    ttft_ms_p99: float | None = None
    tpot_ms_p50: float | None = None
    tpot_ms_p90: float | None = None
    tpot_ms_p99: float | None = None
    itl_ms_p50: float | None = None
    itl_ms_p90: float | None = None
    itl_ms_p99: float | None = None
    e2e_ms_p50: float | None = None
    e2e_ms_p90: float | None = None
    e2e_ms_p99: float | None = None
    queue_ms_p50: float | None = None
    queue_ms_p90: float | None = None
    queue_ms_p99: float | None = None
    missing: dict[str, str] = Field(default_factory=dict)


def _pct(values: list[float]) -> list[float | None]:
    if not values:
        return [None] * len(PERCENTILES)
    return [float(x) for x in np.percentile(np.asarray(values, dtype=np.float64), PERCENTILES)]


def summarize(runs: Sequence[TimedRun], slo_ttft_ms: float | None = None,
              slo_tpot_ms: float | None = None, slo_e2e_ms: float | None = None) -> CellMetrics:
    """The one place every latency, throughput and goodput figure is computed, offline and served alike.

    Per ok request: TTFT = first chunk - sent; TPOT = (last chunk - first chunk) / (output tokens - 1)
    (none for a request whose tokens all came in one chunk);
    ITL = the gaps between consecutive chunks (a chunk of several tokens is one gap, never zeros);
    e2e = last chunk - sent; queue = sent - scheduled (served arrivals only). Per run: throughputs over
    the run's wall time. Goodput: ok requests within both SLOs over every request the runs meant to
    send (an error, or a request never sent, meets none): within TTFT, TPOT and e2e where each is given."""
    ttft, tpot, itl, e2e, queue, engine, paired = [], [], [], [], [], [], []
    scheduled_ms, sent_ms = [], []
    tok_s, total_s, req_s, good_s = [], [], [], []
    errors: dict[str, int] = {}
    missing: dict[str, str] = {}
    planned = sent = ok_n = good = out_total = chunks = 0
    prompt_total: int | None = 0
    unmeasured = 0
    per_run: dict[str, list[float]] = {k: [] for k in _PER_RUN}
    for run in runs:
        for key, why in run.missing.items():
            missing.setdefault(key, why)
        elapsed = max(run.end - run.start, 1e-9)
        first = (len(ttft), len(tpot))
        ok = [r for r in run.requests if r.ok]
        run_good = 0
        for r in ok:
            if r.engine_ttft_s is not None:
                engine.append(r.engine_ttft_s * 1e3)
            if r.scheduled is not None:
                queue.append(max(0.0, r.sent - r.scheduled) * 1e3)
            if not r.chunk_times:
                unmeasured += 1
                continue
            t = (r.chunk_times[0] - r.sent) * 1e3
            ttft.append(t)
            if r.engine_ttft_s is not None:
                paired.append((t, r.engine_ttft_s * 1e3))
            e2e.append((r.chunk_times[-1] - r.sent) * 1e3)
            e = e2e[-1]
            # one chunk holding every token measures no time per token (its decode hides inside TTFT): no TPOT,
            # never a zero
            multi = r.output_tokens > 1 and len(r.chunk_times) > 1
            p = (r.chunk_times[-1] - r.chunk_times[0]) * 1e3 / (r.output_tokens - 1) if multi else None
            if p is not None:
                tpot.append(p)
            itl.extend(np.diff(r.chunk_times) * 1e3)
            chunks += len(r.chunk_times)
            if ((slo_ttft_ms is None or t <= slo_ttft_ms) and (slo_tpot_ms is None or (p or 0.0) <= slo_tpot_ms)
                    and (slo_e2e_ms is None or e <= slo_e2e_ms)):
                run_good += 1
        for name, values in (("ttft_ms", ttft[first[0]:]), ("tpot_ms", tpot[first[1]:])):
            if values:   # each run's own percentiles: the repeats a cross-run interval is built from
                p50, _, p99 = _pct(values)
                per_run[f"{name}_p50_runs"].append(p50)
                per_run[f"{name}_p99_runs"].append(p99)
        for r in run.requests:
            if not r.ok:
                errors[r.error_kind or "error"] = errors.get(r.error_kind or "error", 0) + 1
            if r.scheduled is not None:
                scheduled_ms.append((r.scheduled - run.start) * 1e3)
                sent_ms.append((r.sent - run.start) * 1e3)
        out_tokens = sum(r.output_tokens for r in ok)
        in_tokens = None if any(r.prompt_tokens is None for r in ok) else sum(r.prompt_tokens for r in ok)
        tok_s.append(out_tokens / elapsed)
        total_s.append((out_tokens + (in_tokens or 0)) / elapsed)
        req_s.append(len(ok) / elapsed)
        good_s.append(run_good / elapsed)
        planned += len(run.requests) + run.not_sent
        sent += len(run.requests)
        ok_n += len(ok)
        good += run_good
        out_total += out_tokens
        prompt_total = None if prompt_total is None or in_tokens is None else prompt_total + in_tokens

    if unmeasured:
        why = missing.get("token_times", "the engine gave no time for its tokens")
        for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            missing.setdefault(key, f"{unmeasured} of {ok_n} requests unmeasured: {why}")
        missing.setdefault("goodput", f"TTFT of {unmeasured} requests unmeasured")
    if not ok_n:
        missing.setdefault("ttft_ms", "no request succeeded")
    if not queue:
        missing.setdefault("queue_ms", "no arrival queue: an offline batch, or a closed loop" if ok_n else "no request")
    if not itl and ttft:
        missing.setdefault("itl_ms", "every request came back in one chunk (or had one token)")
    if not tpot and ttft:
        missing.setdefault("tpot_ms", "no request had more than one output token in more than one chunk")
    if prompt_total is None:
        missing.setdefault("total_tok_s", "prompt lengths not known for every request")
        total_s = []
    if not engine:
        missing.setdefault("engine_ttft_ms", "the engine reports no TTFT of its own")
    engine_p50, agrees = _pct(engine)[0], None
    if paired:   # medians over the same requests
        ours, theirs = (float(np.median(x)) for x in zip(*paired))
        agrees = abs(ours - theirs) <= max(ENGINE_TTFT_MARGIN_MS, ENGINE_TTFT_MARGIN_REL * ours)
    out = CellMetrics(
        requests=ok_n, requests_planned=planned, requests_sent=sent, errors=sum(errors.values()),
        errors_by_kind=dict(sorted(errors.items())), output_tokens=out_total, prompt_tokens=prompt_total,
        output_tok_s=float(np.mean(tok_s)) if tok_s else None,
        total_tok_s=float(np.mean(total_s)) if total_s else None,
        req_s=float(np.mean(req_s)) if req_s else None, output_tok_s_runs=[float(x) for x in tok_s],
        goodput=(good / planned if planned else None) if "goodput" not in missing else None,
        goodput_req_s=(float(np.mean(good_s)) if good_s else None) if "goodput" not in missing else None,
        slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, slo_e2e_ms=slo_e2e_ms,
        ttft_ms=ttft if "ttft_ms" not in missing else [], tpot_ms=tpot if "tpot_ms" not in missing else [],
        e2e_ms=e2e if "e2e_ms" not in missing else [],
        chunk_tokens_mean=(out_total / chunks) if chunks and not unmeasured else None,
        itl_samples=len(itl) if "itl_ms" not in missing else 0,
        engine_ttft_ms=engine or None, engine_ttft_ms_p50=engine_p50, engine_ttft_agrees=agrees,
        **{k: (v if k.rsplit("_p", 1)[0] not in missing else []) for k, v in per_run.items()},
        scheduled_ms=scheduled_ms, sent_ms=sent_ms, missing=missing)
    values = {"ttft_ms": out.ttft_ms, "tpot_ms": out.tpot_ms, "e2e_ms": out.e2e_ms,
              "itl_ms": [float(x) for x in itl] if "itl_ms" not in missing else [], "queue_ms": queue}
    for name in LATENCIES:
        for q, v in zip(PERCENTILES, _pct(values[name])):
            setattr(out, f"{name}_p{q}", v)
    return out
