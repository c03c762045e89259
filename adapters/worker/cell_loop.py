"""What both kinds of worker (offline and served cells) share: the event file, the logprob rows, the
timed repeats (a fixed count, or `auto`), and the loop that turns each cell into files or an event."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, NamedTuple, TypeVar

import numpy as np

from adapters.base import Unsupported
from adapters.contract.claims import claim_cell
from adapters.contract.disturbance import Disturbance
from adapters.contract.events import (
    CellDone,
    CellFailed,
    CellStart,
    CellUnsupported,
    EnvFacts,
    GroupUnsupported,
    LoadFailed,
    TurnDone,
    TurnWait,
    WorkerEvent,
)
from adapters.contract.intervals import relative_half_width
from adapters.contract.records import LOGPROB_COLUMNS, LOGPROB_KINDS, TASK_OUTPUTS, CellRecord, TaskOutput, TokenScores
from adapters.contract.specs import CellSpec
from adapters.contract.timing import TimedRun

T = TypeVar("T")


class Events:
    """events.jsonl: one typed event per line, fsynced, so the driver knows which cell ran at a crash."""

    def __init__(self, out_dir: Path):
        self.file = open(out_dir / "events.jsonl", "a", buffering=1)

    def emit(self, event: WorkerEvent) -> None:
        event.t = time.time()
        self.file.write(event.model_dump_json(fallback=str) + "\n")   # str: an engine arg JSON cannot hold
        self.file.flush()
        os.fsync(self.file.fileno())


class LogprobRows:
    """Logprob rows in the layout of adapters.contract.records.LOGPROB_COLUMNS, gathered block by block."""

    def __init__(self) -> None:
        self.parts: dict[str, list[np.ndarray]] = {name: [] for name, _, _ in LOGPROB_COLUMNS}

    def add(self, scores: TokenScores, prompt: list[int] | int, kind: str, repeat: int, prompt_index: int) -> None:
        """One block: a prompt's teacher-forced scores (row i scores token i+1) or its generated tokens
        (row j scores new token j, at position len(prompt) + j). `prompt` may be just its length."""
        n = len(scores)
        start = 1 if kind == "prompt" else (prompt if isinstance(prompt, int) else len(prompt))
        values = {"kind": np.full(n, LOGPROB_KINDS.index(kind)), "repeat": np.full(n, repeat),
                  "prompt_index": np.full(n, prompt_index), "position": np.arange(start, start + n),
                  "token_id": scores.token_ids, "logprob": scores.logprobs,
                  "topk_ids": scores.topk_ids, "topk_logprobs": scores.topk_logprobs}
        for name, dtype, _ in LOGPROB_COLUMNS:
            self.parts[name].append(np.asarray(values[name], dtype=dtype))

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: np.concatenate(parts) for name, parts in self.parts.items() if parts}


class Turns:
    """An env pair's turn-taking, the worker's side (GroupSpec.turns): before each phase of engine work a
    TurnWait event, then a wait for the supervisor's go-ahead (a line on stdin); a TurnDone event after it.
    Without turns, phases start at once."""

    def __init__(self, events: Events, on: bool):
        self.events, self.on = events, on

    @contextlib.contextmanager
    def hold(self, phase: str, cell_id: str | None = None, repeat: int | None = None):
        if not self.on:
            yield
            return
        self.events.emit(TurnWait(cell_id=cell_id, phase=phase, repeat=repeat))
        if not sys.stdin.readline():
            raise RuntimeError("the supervisor closed the turn channel (stdin) of this env pair")
        try:
            yield
        finally:
            self.events.emit(TurnDone())


def env_facts(name: str, env_vars: dict[str, str]) -> EnvFacts:
    """The environment this interpreter is: every installed distribution's version, the Python version and
    the env definition's variables (as this process has them)."""
    packages = {}
    for dist in importlib.metadata.distributions():
        dist_name = dist.metadata["Name"]
        if dist_name and dist_name.lower() not in packages:   # the first on sys.path is the one imported
            packages[dist_name.lower()] = dist.version
    return EnvFacts(name=name, python=platform.python_version(), packages=packages,
                    env_vars={k: os.environ.get(k, "") for k in env_vars})


def chunks(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i:i + size]


def timed_repeats(cell: CellSpec, run_one: Callable[[int], TimedRun], turns: Turns | None = None,
                  clock: list[tuple[float, float]] | None = None, disturbance: Disturbance | None = None,
                  partner: Callable[[int], None] | None = None) -> tuple[list[TimedRun], float | None]:
    """`cell.repeats` timed runs; with `cell.auto`, runs until the output throughput's 95% interval is
    within auto.half_width (at least min_repeats, at most max_repeats or max_s of timed runs; never
    more than the prompts prepared). Returns the runs and the interval's relative half-width. Each run
    waits for its turn (`turns`: an env pair), its wall-clock start and end go into `clock`, and how
    disturbed it was by the rest of the host into `disturbance`. `partner(i)`: the baseline's repeat i in the
    same engine (adapters/worker/timing_partner.py), in ABBA order with the cell's: after it, before the next."""
    runs: list[TimedRun] = []
    auto = cell.auto
    most = cell.repeats if auto is None else min(cell.repeats, auto.max_repeats)
    spent = 0.0
    while len(runs) < most:
        index = len(runs)
        if partner and index % 2:
            partner(index)
        with turns.hold("timed", cell.cell_id, index) if turns else contextlib.nullcontext():
            began = time.time()
            run = disturbance.measure(lambda: run_one(index)) if disturbance else run_one(index)
            if clock is not None:
                clock.append((began, time.time()))
        if partner and not index % 2:
            partner(index)
        runs.append(run)
        spent += run.end - run.start
        if auto and len(runs) >= auto.min_repeats:
            width = relative_half_width([_tok_s(r) for r in runs])
            if (width is not None and width <= auto.half_width) or spent >= auto.max_s:
                break
    return runs, relative_half_width([_tok_s(r) for r in runs])


def _tok_s(run: TimedRun) -> float:
    return sum(r.output_tokens for r in run.requests if r.ok) / max(run.end - run.start, 1e-9)


def load_or_report(load: Callable[[], T], events: Events, cell_ids: list[str]) -> T | None:
    """What load() returns, or None once an event says why none of the group's cells can run."""
    try:
        return load()
    except Unsupported as err:
        events.emit(GroupUnsupported(cells=cell_ids, reason=str(err)))
    except Exception as err:
        events.emit(LoadFailed(cells=cell_ids, reason=f"{type(err).__name__}: {err}",
                               traceback=traceback.format_exc()[-4000:]))
    return None


# what a cell without speculative decoding says of its speculation figures (never a silent null)
NO_SPECULATION = {k: "no speculative decoding in this cell's engine" for k in
                  ("spec_draft_tokens", "spec_accepted_tokens", "spec_acceptance")}


class Measured(NamedTuple):
    """What measuring one cell produced: its record, logprob rows, task outputs and samples."""

    record: CellRecord
    logprobs: dict[str, np.ndarray]
    tasks: list[TaskOutput]
    samples: dict[str, np.ndarray]


def run_cells(cells: list[CellSpec], measure: Callable[[CellSpec], Measured],
              events: Events, out: Path, check: Callable[[], None] = lambda: None, claims_dir: str | None = None) -> None:
    """Each cell in turn: its record, logprob rows and task outputs on disk, or in the events why not.
    `check` runs after each cell (and before a failure is blamed on it): it may end the worker, as serve
    mode's does when its server has died. With `claims_dir`, a cell another node took over is skipped."""
    for cell in cells:
        cid = cell.cell_id
        if claims_dir and not claim_cell(claims_dir, cid):
            continue
        events.emit(CellStart(cell_id=cid))
        started = time.perf_counter()
        try:
            record, logprobs, tasks, samples = measure(cell)
        except Unsupported as err:
            events.emit(CellUnsupported(cell_id=cid, reason=str(err)))
            continue
        except Exception as err:
            check()
            events.emit(CellFailed(cell_id=cid, reason=f"{type(err).__name__}: {err}",
                                   traceback=traceback.format_exc()[-4000:]))
            continue
        check()
        record.duration_s = time.perf_counter() - started
        np.savez(out / f"{cid}.npz", **logprobs)
        if tasks:
            (out / f"{cid}.tasks.json").write_bytes(TASK_OUTPUTS.dump_json(tasks))
        if samples:
            np.savez(out / f"{cid}.samples.npz", **samples)
        (out / f"{cid}.json").write_text(record.model_dump_json())
        events.emit(CellDone(cell_id=cid))
