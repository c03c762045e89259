"""The child process that runs one engine group: `python -m adapters.worker SPEC.json OUT_DIR`.

It runs in the framework's own interpreter, so it imports nothing from the orchestrator, only
this package, numpy, pydantic and psutil; its input is an `adapters.contract.specs.GroupSpec`. It loads
the engine once, then for each cell runs the warm-up and timed batches, the logprob capture, the seeded
samples (measure.sampling) and the group's tasks (adapters.worker.task_runner), and writes for each cell
`<cell_id>.json` (the measurements, an `adapters.contract.records.CellRecord`), `<cell_id>.npz` (the logprob
rows), `<cell_id>.samples.npz` and `<cell_id>.tasks.json` (the task outputs); a spec with `rescore` runs no cell:
its engine scores other cells' samples into `rescored.npz` (adapters.worker.rescoring); one with `hidden` runs
none either: its engine's per-layer hidden states go to `hidden.npz` (adapters.worker.layer_capture). Progress goes to
`events.jsonl`, one typed event per line, so the parent can tell which cell was running when a crash or
a hang happened. Serve cells (`adapters.worker.served_cells`) start the engine's server here instead of
loading the engine.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

from adapters import ADAPTERS
from adapters.base import Adapter, Unsupported
from adapters.contract.arrivals import TraceArrival
from adapters.contract.disturbance import Disturbance
from adapters.contract.events import CellStart, End, GroupUnsupported, Loaded, Started
from adapters.contract.host import host_facts
from adapters.contract.records import NO_TIMING_TWIN, SAMPLE_COLUMNS, CellRecord
from adapters.contract.seed_power import sample_statistic, seeds_to_detect
from adapters.contract.specs import (
    HIDDEN_NPZ,
    RESCORED_NPZ,
    CellSpec,
    GroupSpec,
    SamplingSpec,
    ScoringSpec,
    TaskSpec,
    engine_seed,
)
from adapters.contract.timing import summarize
from adapters.meters import telemetry
from adapters.meters.energy import EnergyMeter
from adapters.meters.memory import MemoryTracker
from adapters.meters.provenance import model_fingerprint
from adapters.serving import arrivals
from adapters.worker.cell_loop import (
    NO_SPECULATION,
    Events,
    LogprobRows,
    Measured,
    Turns,
    chunks,
    env_facts,
    load_or_report,
    run_cells,
    timed_repeats,
)
from adapters.worker.layer_capture import capture
from adapters.worker.rescoring import rescore
from adapters.worker.task_runner import run_tasks
from adapters.worker.timing_partner import PartnerTiming, less


def capture_logprobs(adapter: Adapter, scoring: ScoringSpec, batch_size: int) -> dict[str, np.ndarray]:
    """Teacher-forced and greedy logprobs of the scoring prompts, at the cell's batch size."""
    rows = LogprobRows()
    prompts = scoring.prompts
    for repeat in range(scoring.repeats):
        for first, chunk in zip(range(0, len(prompts), batch_size), chunks(prompts, batch_size)):
            for j, (s, p) in enumerate(zip(adapter.score(chunk, scoring.top_k), chunk)):
                rows.add(s, p, "prompt", repeat, first + j)
            for j, (s, p) in enumerate(zip(adapter.greedy(chunk, scoring.greedy_tokens, scoring.top_k), chunk)):
                rows.add(s, p, "generation", repeat, first + j)
    return rows.arrays()


def _seeds_wanted(cols: dict[str, list], sampling: SamplingSpec, drawn: int) -> int:
    """seeds: auto: how many seeds the cell's own spread asks for (at least one step more, at most
    max_seeds); `drawn` where that is reached or nothing more may be drawn."""
    auto = sampling.auto
    if auto is None or drawn >= auto.max_seeds:
        return drawn
    first = np.asarray(cols["repeat"]) == 0
    stat = [sample_statistic(lp) for lp, keep in zip(cols["logprobs"], first) if keep]
    needed = seeds_to_detect(np.asarray(stat), np.asarray(cols["prompt_index"])[first], np.asarray(cols["seed"])[first],
                             sampling.auto_shift, sampling.auto_level)
    if needed is None or needed <= drawn:
        return drawn
    return min(auto.max_seeds, max(drawn + auto.step, needed))


def capture_samples(adapter: Adapter, sampling: SamplingSpec, batch_size: int) -> dict[str, np.ndarray]:
    """Seeded samples of every (prompt, seed), `repeats` times, batch_size pairs per engine call; with
    seeds: auto, more seeds until the cell's own spread says the distribution test has its power."""
    cols: dict[str, list] = {name: [] for name, _ in SAMPLE_COLUMNS}
    k = sampling.next_top_k
    try:   # the next token's candidates: one greedy step, the first row's top-k
        nxt = [g for chunk in chunks(sampling.prompts, batch_size) for g in adapter.greedy(chunk, 1, k)] if k else []
        nxt = [(g.topk_ids[0], g.topk_logprobs[0]) for g in nxt]
    except Unsupported:    # e.g. vLLM's max_logprobs below next_top_k: the first-token test says it has none
        nxt = []
    if not nxt:
        nxt = [(np.zeros(0, np.int32), np.zeros(0, np.float32))] * len(sampling.prompts)
    drawn, wanted = 0, sampling.seeds
    while wanted > drawn:
        pairs = [(i, sampling.seed_offset + s) for i in range(len(sampling.prompts)) for s in range(drawn, wanted)]
        for repeat in range(sampling.repeats):
            for batch in chunks(pairs, batch_size):
                got = adapter.sample([sampling.prompts[i] for i, _ in batch], [engine_seed(s, i) for i, s in batch],
                                     sampling.settings, sampling.tokens)
                for (i, seed), scores in zip(batch, got):
                    for name, value in (("repeat", repeat), ("prompt_index", i), ("seed", seed),
                                        ("token_ids", scores.token_ids), ("logprobs", scores.logprobs),
                                        ("next_topk_ids", nxt[i][0]), ("next_topk_logprobs", nxt[i][1])):
                        cols[name].append(value)
        drawn, wanted = wanted, _seeds_wanted(cols, sampling, wanted)
    return {name: np.asarray(cols[name], dtype=dtype) for name, dtype in SAMPLE_COLUMNS}


def _spec_figures(before: tuple[int, int] | None, after: tuple[int, int] | None) -> dict:
    if before is None or after is None:
        return {}
    drafted, accepted = after[0] - before[0], after[1] - before[1]
    return {"spec_draft_tokens": drafted, "spec_accepted_tokens": accepted,
            "spec_acceptance": accepted / drafted if drafted else None}


def _spans(cell: CellSpec, stream: bool) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(warm-up, timed) slices of the timing prompts: static batches of batch_size, or for a stream
    one warm-up stream of warmup x batch_size requests and timed streams of stream_requests each."""
    if stream:
        warm = cell.warmup * cell.batch_size
        per = cell.stream_requests
        return ([(0, warm)] if warm else []), [(warm + r * per, warm + (r + 1) * per) for r in range(cell.repeats)]
    n, b = len(cell.timing_prompts), cell.batch_size
    spans = [(i, min(i + b, n)) for i in range(0, n, b)]
    return spans[: cell.warmup], spans[cell.warmup:]


def stream_arrivals(cell: CellSpec, lo: int, hi: int) -> list[float]:
    """When each request of a timed stream (timing prompts lo..hi) arrives, in seconds after the stream's
    start: the shape's offsets at the cell's rate (seeded as a served load point's), or the trace's own gaps
    for those requests (the first arriving at 0)."""
    a = cell.arrival
    if a.kind == "trace":
        a = TraceArrival(gaps_s=a.gaps_s[lo:hi])
    return arrivals.offsets(a, math.inf if cell.request_rate is None else cell.request_rate, hi - lo)


def _generate(adapter: Adapter, cell: CellSpec, span: tuple[int, int], stream: bool, timed: bool):
    lo, hi = span
    lens = cell.output_lens[lo:hi] if cell.output_lens else cell.output_len
    if timed and stream and cell.arrival is not None:   # the warm-up stream goes in at once
        return adapter.generate(cell.timing_prompts[lo:hi], lens, cell.ignore_eos,
                                arrivals_s=stream_arrivals(cell, lo, hi))
    return adapter.generate(cell.timing_prompts[lo:hi], lens, cell.ignore_eos)


def drift_check(adapter: Adapter, cell: CellSpec) -> list[float]:
    """The cell's warm-up and timed batch, timed once more (output tok/s per repeat, as summarize counts it):
    the group's first cell is timed so at the group's start and measured as usual at its end, so the run
    sees how far the host moved between two measurements of one batch (CellRecord.output_tok_s_recheck_runs)."""
    warm, timed = _spans(cell, False)
    for span in warm:
        _generate(adapter, cell, span, False, False)
    runs, _ = timed_repeats(cell, lambda r: _generate(adapter, cell, timed[r], False, True))
    return summarize(runs).output_tok_s_runs


def drift_order(spec: GroupSpec) -> list[CellSpec]:
    """The order the group's cells run in: with a drift check (an offline group of two or more cells, not an
    env pair, whose first cell has at least two repeats), that first cell moves to the end, its batch timed
    once before the others (drift_check)."""
    cells = spec.cells
    if not spec.drift_check or spec.mode != "offline" or spec.turns or len(cells) < 2 or cells[0].repeats < 2:
        return cells
    return cells[1:] + cells[:1]


def run_cell(adapter: Adapter, cell: CellSpec, scoring: ScoringSpec | None, tasks: list[TaskSpec],
             sampling: SamplingSpec | None, memory: MemoryTracker, energy: EnergyMeter, stream: bool = False,
             turns: Turns | None = None, partner: CellSpec | None = None) -> Measured:
    """One cell's timings, logprobs, samples and tasks. `partner`: its baseline in this group, whose timed batch
    takes turns with the cell's repeats (adapters/worker/timing_partner.py)."""
    def gen(span: tuple[int, int], timed: bool = False):
        return _generate(adapter, cell, span, stream, timed)

    if stream and cell.arrival is not None and not adapter.follows_arrivals:
        raise Unsupported(f"{adapter.name}: this adapter cannot hand a stream's requests to the engine on an "
                          f"arrival schedule ({cell.arrival.kind})")
    turns = turns or Turns(None, False)
    warm, timed = _spans(cell, stream)
    side = None if partner is None else PartnerTiming(
        adapter, partner, *_spans(partner, stream), lambda span, t: _generate(adapter, partner, span, stream, t))
    with turns.hold("warmup", cell.cell_id):
        for span in warm:
            gen(span)
        if side:
            side.warm_up()
    memory.reset_peak()
    spec_before, engine_before = adapter.spec_counters(), adapter.engine_metrics()
    energy.reset()
    clock: list[tuple[float, float]] = []
    peaks: list[tuple[int | None, str | None]] = []   # with a partner: around the cell's own repeats only

    def timed_run(r: int):
        if side:
            memory.reset_peak()
        run = energy.measure(lambda: gen(timed[r], True))
        if side:
            peaks.append(memory.peak())
        return run

    host = Disturbance(reach_back=not turns.on)   # turns: the gaps between repeats hold the other side's work
    runs, width = timed_repeats(cell, timed_run, turns, clock, host, side)
    spec = _spec_figures(spec_before, less(adapter.spec_counters(), side and side.spec_moved))
    tel, tel_missing = telemetry.figures(
        engine_before, less(adapter.engine_metrics(), side and side.engine_moved), None,
        unavailable=None if engine_before is not None else f"{adapter.name}: {adapter.no_metrics_reason}",
        gauges_why=telemetry.OFFLINE_GAUGES)
    metrics = summarize(runs)
    joules, joules_missing = energy.figures(metrics.output_tokens)
    if peaks:   # the largest of the cell's own repeats, or why one was not measured
        why = next((w for _, w in peaks if w), None)
        peak = None if why else max(p for p, _ in peaks)
    else:
        peak, why = memory.peak()
    if why:
        metrics.missing["peak_mem_bytes"] = why
    metrics.missing.update(tel_missing | joules_missing | host.missing)
    if side and side.failed:
        metrics.missing.update(dict.fromkeys(NO_TIMING_TWIN, side.failed))
    record = CellRecord(**metrics.model_dump(), **host.figures(), peak_mem_bytes=peak, repeats=len(runs), repeats_halfwidth=width,
                        notes=list(cell.notes), repeat_started_at=[a for a, _ in clock],
                        repeat_ended_at=[b for _, b in clock], **spec, **tel, **joules,
                        **(side.figures() if side else {}))
    if spec and record.spec_acceptance is None:
        record.missing["spec_acceptance"] = "no draft tokens were proposed in the timed batches"
    if not spec:
        record.missing.update(NO_SPECULATION)
    with turns.hold("after", cell.cell_id):
        logprobs, samples, task_outputs = _after_timing(adapter, cell, record, scoring, sampling, tasks)
    return Measured(record, logprobs, task_outputs, samples)


def _after_timing(adapter: Adapter, cell: CellSpec, record: CellRecord, scoring: ScoringSpec | None,
                  sampling: SamplingSpec | None, tasks: list[TaskSpec]):
    """The cell's logprobs, seeded samples and task outputs, after its timings."""
    logprobs = {}
    if scoring:
        try:
            logprobs = capture_logprobs(adapter, scoring, cell.batch_size)
        except Unsupported as err:  # e.g. a KV-reuse flag that forbids full logits: keep the timings
            record.notes.append(f"logprobs not captured: {err}")
    samples = {}
    if sampling:
        try:
            samples = capture_samples(adapter, sampling, cell.batch_size)
        except Unsupported as err:   # the timings and logprobs stand; the samples are null with the reason
            record.missing["samples"] = str(err)
    return logprobs, samples, run_tasks(adapter, tasks, cell.batch_size)


def _missing_modules(cls: type[Adapter]) -> list[str]:
    return [m for m in cls.requires_modules if importlib.util.find_spec(m) is None]


def _provenance(spec: GroupSpec, endpoint: str | None) -> dict:
    """What the Loaded event says beyond the adapter's facts: the model's fingerprint and the host."""
    if endpoint:
        digest, why = None, "an endpoint given by the matrix: its model files are not ours to read"
    else:
        digest, why = model_fingerprint(spec.load.model.source, spec.load.cache_dir or None)
    return {"model_fingerprint": digest, "host": host_facts(),
            "missing": {"model_fingerprint": why} if why else {}}


def main(spec_path: str, out_dir: str) -> int:
    out = Path(out_dir)
    spec = GroupSpec.model_validate_json(Path(spec_path).read_text())
    events = Events(out)
    events.emit(Started(pid=os.getpid(), python=sys.executable))
    load = spec.load
    cls = ADAPTERS[load.framework]
    cell_ids = [c.cell_id for c in spec.cells]
    endpoint = spec.serve.endpoint if spec.mode == "serve" and spec.serve else None   # someone else's server

    missing = [] if endpoint else _missing_modules(cls)
    if missing:
        hint = f"; create it with: {cls.install_hint}" if cls.install_hint else ""
        events.emit(GroupUnsupported(cells=cell_ids, reason=f"{cls.name} environment not installed in this "
                                     f"interpreter (missing: {', '.join(missing)}){hint}"))
        return 0
    adapter = cls()
    reason = None if endpoint else adapter.check(load)
    if reason:
        events.emit(GroupUnsupported(cells=cell_ids, reason=reason))
        return 0
    provenance = _provenance(spec, endpoint)
    if spec.mode == "serve":
        from adapters.worker.served_cells import serve_group  # the load generator and server: serve groups only

        return serve_group(spec, adapter, events, out, provenance)

    memory = MemoryTracker(load.device).start()
    turns = Turns(events, spec.turns)
    with turns.hold("load"):
        t0 = time.perf_counter()
        facts = load_or_report(lambda: adapter.load(load), events, cell_ids)
        load_s = time.perf_counter() - t0
    if facts is None:
        return 0
    memory.extra_pids = facts.memory_pids
    env = env_facts(spec.env_name, spec.env_vars) if spec.env_name else None
    events.emit(Loaded(load_s=load_s, load_peak_mem_bytes=memory.peak()[0], mem_source=memory.source, facts=facts,
                       env=env, **provenance))

    if spec.rescore is not None:   # no cells: the baseline's engine scores other cells' samples
        np.savez(out / RESCORED_NPZ, **rescore(adapter, spec.rescore))   # End, after it, commits it
        adapter.close()
        events.emit(End())
        return 0
    if spec.hidden is not None:   # no cells: the engine's residual stream per block (bench explain --layers)
        np.savez(out / HIDDEN_NPZ, **capture(adapter, spec.hidden))
        adapter.close()
        events.emit(End())
        return 0
    stream = spec.mode == "stream"
    energy = EnergyMeter(load.device)
    order = drift_order(spec)
    early: dict[str, list[float] | str] = {}   # the moved cell's early timing, or why there is none
    if order is not spec.cells:   # the drift check: the moved cell's batch timed before the others
        events.emit(CellStart(cell_id=order[-1].cell_id))   # an engine crash here is that cell's
        try:
            early[order[-1].cell_id] = drift_check(adapter, order[-1])
        except Exception as err:   # its cell runs without one (and fails by itself if the engine is broken)
            early[order[-1].cell_id] = f"the drift check's early timing failed: {type(err).__name__}: {err}"

    # a cell's baseline in this group takes turns with it (not where the group takes turns with another engine)
    by_id = {c.cell_id: c for c in spec.cells}

    def measure(cell: CellSpec) -> Measured:
        partner = None if turns.on else by_id.get(cell.timing_partner or "")
        got = run_cell(adapter, cell, spec.scoring, spec.tasks, spec.sampling, memory, energy, stream, turns, partner)
        runs = early.get(cell.cell_id)
        if isinstance(runs, str):
            got.record.missing["output_tok_s_recheck_runs"] = runs
        elif runs is not None:
            got.record.output_tok_s_recheck_runs = runs
        else:   # a null says why: one cell a group is timed twice (drift_order), and not every group is checked
            got.record.missing["output_tok_s_recheck_runs"] = "not this group's drift-check cell"
        if got.record.base_timing_cell is None:   # the launcher fills base_* where a twin ran beside it
            for key, why in NO_TIMING_TWIN.items():
                got.record.missing.setdefault(key, why)
        return got

    run_cells(order, measure, events, out, claims_dir=spec.claims_dir)
    adapter.close()
    memory.stop()
    events.emit(End())
    return 0


def exit_now(code: int) -> None:
    """Exit without the interpreter's teardown, which after torch takes 1-2 s of the group's time for
    nothing: every result is on disk (files closed, events fsynced) and adapter.close() has stopped the
    engine. (Helpers such as multiprocessing's resource tracker notice this process is gone, clean up
    and exit by themselves, as after a normal exit.)"""
    sys.stdout.flush()
    sys.stderr.flush()
    with contextlib.suppress(OSError, AttributeError):   # and C stdio buffers (engines' own output)
        ctypes.CDLL(None).fflush(None)
    os._exit(code)

