"""The worker's serve mode: one server per engine group, one load point per cell.

The group's server is the engine's own (`Adapter.server`), started on a free loopback port and
stopped at the end; or, for a model with an `endpoint`, a server someone else runs (nothing is
started or stopped, and its memory is not ours to measure). Per cell: `warmup` x batch_size untimed
requests, then `repeats` timed runs of the load point (at most batch_size in flight, arriving at
request_rate, or a closed loop), then the output capture through the API at the same concurrency.

A server that dies during a cell takes the worker with it (exit 3, the server's last output on
stdout): the launcher records the cell as crashed and starts a fresh worker, and so a fresh server,
for the cells left.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from adapters.base import Adapter, Unsupported
from adapters.contract.arrivals import TraceArrival
from adapters.contract.disturbance import Disturbance
from adapters.contract.events import End, Loaded, LoadFacts
from adapters.contract.openai_api import STREAM_COUNT_NOTES, ServerApi, stream_count
from adapters.contract.records import CellRecord
from adapters.contract.specs import CellSpec, GroupSpec, SamplingSpec, ScoringSpec, ServeSpec, TaskSpec
from adapters.contract.timing import summarize
from adapters.meters import telemetry
from adapters.meters.energy import EnergyMeter
from adapters.meters.memory import MemoryTracker
from adapters.serving import capture as served_capture
from adapters.serving import http_client, load_generator, server_process, slo_search
from adapters.serving.server_process import ServerProcess
from adapters.worker.cell_loop import (
    NO_SPECULATION,
    Events,
    LogprobRows,
    Measured,
    load_or_report,
    run_cells,
    timed_repeats,
)
from adapters.worker.task_runner import run_tasks


@dataclass
class Target:
    """The server the cells talk to."""

    url: str
    api: ServerApi
    model: str | None
    to_id: object
    headers: dict | None
    settings: ServeSpec
    server: ServerProcess | None = None
    reset_path: str | None = None
    metrics: telemetry.Scraper | None = None    # the server's /metrics, where it has one
    no_metrics: str | None = None                # why not

    def watch_metrics(self) -> None:
        self.metrics = telemetry.Scraper(self.url, self.headers)
        self.no_metrics = self.metrics.unavailable()
        if self.no_metrics:
            self.metrics = None

    def reset_cache(self) -> None:
        if self.reset_path:
            http_client.post(self.url, self.reset_path, self.headers)

    def load_kwargs(self, output_len: int, ignore_eos: bool) -> dict:
        s = self.settings
        return dict(max_tokens=output_len, ignore_eos=ignore_eos, seed=s.seed,
                    request_timeout_s=s.request_timeout_s, model=self.model, headers=self.headers)

    def check_alive(self) -> None:
        """Exit the worker when the started server has died: the launcher makes the cell `crashed`."""
        how = self.server.exit_description() if self.server else None
        if how:  # the launcher keeps the end of this output as the reason: the verdict goes last
            print(f"the server's last output:\n{self.server.log_tail(1200)}\n"
                  f"the engine's server {how} while this cell ran", flush=True)
            os._exit(3)


def _server_tokens(target: Target, texts: list[str], notes: list[str], what: str, intended: list[list[int]]):
    """Prompt token ids of text prompts as the server tokenizes them (None where it cannot say)."""
    ids = [http_client.tokenize_remote(target.url, target.api, t, target.model, target.headers) for t in texts]
    known = [(a, b) for a, b in zip(ids, intended) if a is not None]
    if not known:
        notes.append(f"{what} sent as text (this server takes no token ids) and it has no tokenizer endpoint: "
                     "prompt lengths as its usage reports them")
        return ids
    differ = sum(a != b for a, b in known)
    lengths = [len(a) for a, _ in known]
    notes.append(f"{what} sent as text (this server takes no token ids): the server's tokenizer gave "
                 f"{min(lengths)}-{max(lengths)} tokens (mean {np.mean(lengths):.1f}); {differ} of {len(known)} "
                 f"differ from the run's token ids")
    return ids


class ServedScorer:
    """The task runner's Scorer (adapters.worker.task_runner) over the cell's server: greedy completions, and
    teacher-forced rows from its prompt logprobs, through the OpenAI API, `concurrency` at a time."""

    def __init__(self, target: Target, concurrency: int):
        self.target, self.concurrency = target, concurrency

    def _capture(self, prompts: list[list[int]], max_tokens: int, top_k: int, want_prompt: bool):
        t = self.target
        if not t.api.prompt_ids:   # the text would be re-tokenized by the server: not the ids the task scores
            raise Unsupported("this server takes text prompts only; tasks send token ids")
        if not t.api.logprobs:
            raise Unsupported("this server returns no logprobs over its OpenAI API")
        return served_capture.capture(t.url, t.api, prompts, prompts, max_tokens=max_tokens, top_k=top_k,
                                      concurrency=self.concurrency, seed=t.settings.seed, model=t.model,
                                      to_id=t.to_id, headers=t.headers, timeout_s=t.settings.request_timeout_s,
                                      want_prompt=want_prompt)

    def greedy(self, prompts: list[list[int]], n_tokens: int, top_k: int):
        return [c.generation for c in self._capture(prompts, n_tokens, top_k, False)]

    def score(self, prompts: list[list[int]], top_k: int):
        if not self.target.api.prompt_ids:
            raise Unsupported("this server takes text prompts only; tasks send token ids")
        if self.target.api.prompt_logprobs is None:
            raise Unsupported("this server offers no prompt logprobs, which choice scoring needs")
        caps = self._capture(prompts, 1, top_k, True)
        if any(c.prompt is None for c in caps):
            raise Unsupported("the server returned no prompt logprobs")
        return [c.prompt for c in caps]


def _timing_prompts(target: Target, cell: CellSpec, notes: list[str]):
    """The cell's timing prompts as this server takes them (ids, or text), and their token counts."""
    ids = cell.timing_prompts
    if cell.timing_messages is not None:
        return cell.timing_messages, _chat_lengths(target, cell.timing_messages, ids, notes)
    if target.api.prompt_ids:
        return ids, [len(p) for p in ids]
    prompts = cell.timing_texts
    server_ids = _server_tokens(target, prompts, notes, "timing prompts", ids)
    lengths = [len(x) if x is not None else None for x in server_ids]
    return prompts, None if any(x is None for x in lengths) else lengths


def _chat_lengths(target: Target, messages: list[list[dict]], intended: list[list[int]],
                  notes: list[str]) -> list[int] | None:
    """A chat cell's prompt token counts as the server renders the messages with its own copy of the chat
    template, checked against the ids the run's template gave (each distinct chat asked once, before the
    timed runs). A difference is stated in the notes, and the server's counts are the prompt lengths."""
    seen: dict[str, tuple] = {}
    for msgs, ids in zip(messages, intended):
        key = json.dumps(msgs, sort_keys=True)
        if key not in seen:
            seen[key] = http_client.chat_prompt_tokens(target.url, target.api, msgs, target.model, target.headers,
                                                          target.settings.request_timeout_s) + (ids,)
    how = next(iter(seen.values()))[2]
    checked = [(sids, n, ids) for sids, n, _, ids in seen.values() if n is not None]
    if not checked:
        notes.append(f"chat: the server reported no prompt token count ({how}): the template's ids are not checked "
                     "against its rendering; prompt lengths as the stream's usage reports them")
        return None
    differ = [(n, len(ids)) for _, n, ids in checked if n != len(ids)]
    # where the server gives ids (not only a count), say how many are the same ids, not just as many
    same = (f"; {sum(sids == ids for sids, _, ids in checked)} of {len(checked)} are the same ids"
            if checked[0][0] is not None else "")
    if differ:
        deltas = [a - b for a, b in differ]
        notes.append(f"chat: MISMATCH: the server's chat template ({how}) rendered {len(differ)} of {len(checked)} "
                     f"distinct chats to another prompt token count than the run's template (server minus ours: "
                     f"{min(deltas):+d} to {max(deltas):+d} tokens){same}; the server's counts are the prompt lengths")
    else:
        notes.append(f"chat: the server's chat template ({how}) gives the run's prompt token count for all "
                     f"{len(checked)} distinct chats{same}")
    counts = {key: n for key, (_, n, _, _) in seen.items()}
    out = [counts[json.dumps(m, sort_keys=True)] for m in messages]
    return None if any(n is None for n in out) else out


def _per_request(cell: CellSpec, lo: int, hi: int) -> dict:
    """A slice's own output lengths and multi-turn links (a link to a request outside the slice is dropped)."""
    out = {}
    if cell.output_lens:
        out["max_tokens"] = cell.output_lens[lo:hi]
    if cell.follows:
        out["follows"] = [k if j >= k else 0 for j, k in enumerate(cell.follows[lo:hi])]
        out["think_time_s"] = cell.think_time_s
    return out


def _warm_up(target: Target, cell: CellSpec, prompts, lengths) -> int:
    """`warmup` x batch_size untimed requests; returns how many prompts they used."""
    n_warm = cell.warmup * cell.batch_size
    if n_warm:
        load_generator.run_load(target.url, target.api, prompts[:n_warm],
                                load_generator.LoadProfile(concurrency=cell.batch_size, requests=n_warm,
                                                           time_limit_s=target.settings.time_limit_s),
                                prompt_tokens=lengths[:n_warm] if lengths else None,
                                **(target.load_kwargs(cell.output_len, cell.ignore_eos) | _per_request(cell, 0, n_warm)))
    return n_warm


def _arrival(cell: CellSpec, s: ServeSpec, lo: int, n: int):
    """A run's arrival shape: the group's, or a trace workload's own times for the run's requests."""
    if cell.arrival is None:
        return s.arrival
    return TraceArrival(gaps_s=cell.arrival.gaps_s[lo:lo + n])


def measure_load_point(target: Target, cell: CellSpec, prompts, lengths, first: int, rate: float,
                       concurrency: int, memory: MemoryTracker | None, notes: list[str],
                       energy: EnergyMeter | None = None) -> CellRecord:
    """The timed runs of one load point (prompts from index `first` on) and their record."""
    s = target.settings
    kw = target.load_kwargs(cell.output_len, cell.ignore_eos)
    per_run = s.requests
    if memory:
        memory.reset_peak()

    def one_run(r: int):
        target.reset_cache()
        lo = first + r * per_run
        profile = load_generator.LoadProfile(concurrency=concurrency, rate=rate, arrival=_arrival(cell, s, lo, per_run),
                                             requests=per_run, time_limit_s=s.time_limit_s)
        def load():
            return load_generator.run_load(target.url, target.api, prompts[lo:lo + per_run], profile,
                                           prompt_tokens=lengths[lo:lo + per_run] if lengths else None,
                                           **(kw | _per_request(cell, lo, lo + per_run)))
        return energy.measure(load) if energy else load()

    if energy:
        energy.reset()
    # the server's counters just before the first timed run and after the last; its gauges sampled in between
    tel_before, no_tel = _scrape(target)
    if not no_tel:
        target.metrics.start_sampling()
    host = Disturbance() if energy else None   # the server runs in the engine child's session, here
    try:
        runs, width = timed_repeats(cell, one_run, disturbance=host)
    finally:
        gauges = None if no_tel else target.metrics.stop_sampling()
    tel_after, no_tel = _scrape(target) if not no_tel else (None, no_tel)
    target.check_alive()
    metrics = summarize(runs, s.slo_ttft_ms, s.slo_tpot_ms, s.slo_e2e_ms)
    notes = list(notes)
    tel, tel_missing = telemetry.figures(tel_before, tel_after, gauges, unavailable=no_tel)
    joules, joules_missing = energy.figures(metrics.output_tokens) if energy else (
        {}, dict.fromkeys(("energy_j", "energy_j_per_token"),
                          "an endpoint given by the matrix: its energy is not ours to measure"))
    metrics.missing.update(tel_missing | joules_missing)
    if gauges is not None and target.metrics.scrape_s:
        ms = 1e3 * float(np.mean(target.metrics.scrape_s))
        notes.append(f"server telemetry: {len(gauges)} gauge samples of GET /metrics during the timed runs, one every "
                     f"{telemetry.GAUGE_INTERVAL_S:g} s; a scrape took {ms:.0f} ms on average")
    notes.append(f"output tokens per stream chunk counted from {STREAM_COUNT_NOTES[stream_count(target.api)]}")
    first_errors = [r.error for run in runs for r in run.requests if not r.ok][:3]
    if first_errors:
        notes.append("first errors: " + " | ".join(first_errors))
    if cell.ignore_eos and not target.api.ignore_eos:
        early = sum(1 for run in runs for r in run.requests if r.ok and r.finish_reason == "stop")
        notes.append(f"this server cannot ignore EOS: {early} of {metrics.requests} timed requests ended at EOS "
                     f"before their output length")
    peak, why = memory.peak() if memory else (None, "an endpoint given by the matrix: its memory is not ours to measure")
    if why:
        metrics.missing["peak_mem_bytes"] = why
    busy = host.figures() if host else {}
    metrics.missing.update(host.missing if host else dict.fromkeys(
        ("host_busy_runs", "gpu_busy_runs"), "an endpoint given by the matrix: its host is not ours to watch"))
    record = CellRecord(**metrics.model_dump(), peak_mem_bytes=peak, repeats=len(runs), repeats_halfwidth=width,
                        notes=notes, **busy, **tel, **joules)
    record.missing.update({k: "not counted through a server's API" for k in NO_SPECULATION})
    return record


def run_served_cell(target: Target, cell: CellSpec, scoring: ScoringSpec | None, tasks: list[TaskSpec],
                    sampling: SamplingSpec | None, memory: MemoryTracker | None, out: Path,
                    energy: EnergyMeter | None = None) -> Measured:
    conc = cell.batch_size
    notes: list[str] = list(cell.notes)
    prompts, lengths = _timing_prompts(target, cell, notes)
    n_warm = _warm_up(target, cell, prompts, lengths)
    search = target.settings.search
    if search is None:
        rate = math.inf if cell.request_rate is None else cell.request_rate
        record = measure_load_point(target, cell, prompts, lengths, n_warm, rate, conc, memory, notes, energy)
    else:
        def probe(load: float):
            rate, c = (load, conc) if search.variable == "rate" else (math.inf, int(load))
            rec = measure_load_point(target, cell, prompts, lengths, n_warm, rate, c, memory, notes, energy)
            return rec, None if math.isinf(rate) else rate, c

        outcome, probes = slo_search.search(search, probe, out / f"{cell.cell_id}.probes.json")
        record = slo_search.summary_record(search, outcome, probes)
    logprobs = {}
    if scoring and not target.api.logprobs:
        record.notes.append("logprobs not captured: this server returns no logprobs over its OpenAI API")
    elif scoring:
        logprobs = capture_served(target, scoring, conc, record.notes)
    if sampling:
        record.missing["samples"] = "serve cells do not sample yet: bench diff-endpoints compares served sampling"
    return Measured(record, logprobs, run_tasks(ServedScorer(target, conc), tasks, conc), {})


def _scrape(target: Target) -> tuple[telemetry.Snapshot | None, str | None]:
    """The server's metrics now, or why not."""
    if target.metrics is None:
        return None, f"server telemetry: {target.no_metrics}"
    try:
        return target.metrics.snapshot(), None
    except Exception as err:
        return None, f"server telemetry: GET /metrics failed during the cell: {err}"


def capture_served(target: Target, scoring: ScoringSpec, concurrency: int, notes: list[str]) -> dict[str, np.ndarray]:
    """The scoring prompts through the API, `concurrency` at a time, `repeats` times: greedy rows, and
    teacher-forced rows where the server offers prompt logprobs."""
    api = target.api
    intended = scoring.prompts
    if api.prompt_ids:
        prompts, prompt_ids = intended, intended
    else:
        prompts = scoring.texts
        prompt_ids = _server_tokens(target, prompts, notes, "scoring prompts", intended)
    if api.prompt_logprobs is None:
        notes.append("this server offers no prompt logprobs: only greedy rows were captured (text layer only)")
    rows = LogprobRows()
    want, early = scoring.greedy_tokens, 0
    for repeat in range(scoring.repeats):
        caps = served_capture.capture(target.url, api, prompts, prompt_ids, max_tokens=want, top_k=scoring.top_k,
                                      concurrency=concurrency, seed=target.settings.seed, model=target.model,
                                      to_id=target.to_id, headers=target.headers,
                                      timeout_s=target.settings.request_timeout_s)
        for i, c in enumerate(caps):
            # only the prompt's length places the generated rows
            n_prompt = len(c.prompt_ids) if c.prompt_ids else int(c.usage.get("prompt_tokens") or 0)
            if c.prompt is not None:
                rows.add(c.prompt, n_prompt, "prompt", repeat, i)
            rows.add(c.generation, n_prompt, "generation", repeat, i)
            early += len(c.generation) < want
    if early:
        notes.append(f"greedy capture: {early} completions ended before {want} tokens (EOS: this server cannot "
                     "ignore it); the analysis counts the missing tokens as a divergence")
    arrays = rows.arrays()
    unmapped = int((arrays["token_id"] < 0).sum()) if arrays else 0
    if unmapped:
        notes.append(f"{unmapped} captured tokens could not be mapped to one token id (token_id -1)")
    return arrays


def _start(spec: GroupSpec, adapter: Adapter, out: Path) -> tuple[Target, LoadFacts]:
    s, api, load = spec.serve, type(adapter).server_api, spec.load
    headers = None
    if s.api_key_env:
        key = os.environ.get(s.api_key_env)
        if not key:
            raise Unsupported(f"serve: the environment variable {s.api_key_env} (the model's api_key_env) is not set")
        headers = {"Authorization": f"Bearer {key}"}
    if s.endpoint:
        url = s.endpoint
        model = http_client.served_model_name(url, headers)
        facts = LoadFacts(engine_args={"endpoint": url, "served_model": model},
                          notes=["an endpoint given by the matrix: nothing was started or stopped here, and its "
                                 "memory is not measured"])
        to_id = None if api.ids_in_logprobs else adapter.token_strings(load)
        target = Target(url, api, model, to_id, headers, s)
        target.watch_metrics()
        return target, facts
    port = server_process.free_port()
    launch = adapter.server(load, port)
    server = ServerProcess(launch, port, str(out / "server.log"), s.startup_timeout_s, api.health_path).start()
    facts = LoadFacts(versions=launch.versions, engine_args=launch.engine_args, notes=list(launch.notes))
    if not launch.reset_path:
        facts.notes.append("the server's prefix cache is not emptied between timed runs: a request may reuse KV "
                           "of an earlier one with the same prompt prefix")
    target = Target(server.url, api, launch.model_name, launch.to_id, headers, s, server, launch.reset_path)
    target.watch_metrics()
    return target, facts


def serve_group(spec: GroupSpec, adapter: Adapter, events: Events, out: Path, provenance: dict) -> int:
    cell_ids = [c.cell_id for c in spec.cells]
    api = type(adapter).server_api
    memory = None if spec.serve.endpoint else MemoryTracker(spec.load.device).start()
    energy = None if spec.serve.endpoint else EnergyMeter(spec.load.device)
    t0 = time.perf_counter()
    started = load_or_report(lambda: _start(spec, adapter, out), events, cell_ids)
    if started is None:
        return 0
    target, facts = started
    facts.batch_mode = "batched" if api.batches else "sequential"
    if not api.batches:
        facts.notes.append("this server runs one request at a time: concurrent requests wait in its queue")
    events.emit(Loaded(load_s=None if target.server is None else time.perf_counter() - t0,
                       load_peak_mem_bytes=memory.peak()[0] if memory else None,
                       mem_source=memory.source if memory else "not measured (endpoint)", facts=facts,
                       **provenance))
    try:
        # a failure because the server died is a crash, not an error: check_alive ends the worker
        run_cells(spec.cells, lambda cell: run_served_cell(target, cell, spec.scoring, spec.tasks, spec.sampling, memory,
                                                           out, energy), events, out, target.check_alive,
                  spec.claims_dir)
    finally:
        if target.server:
            target.server.stop()
        if memory:
            memory.stop()
    events.emit(End())
    return 0
