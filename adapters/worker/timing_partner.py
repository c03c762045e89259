"""A cell's baseline in its own engine group, timed in turns with it (CellSpec.timing_partner): one engine load,
so no twin is needed. The cells of one group are otherwise timed minutes apart (batch 4 after batch 1), and
a host whose load moved between them moves their ratio; timed repeat by repeat in ABBA order, both sides see
the same host and the judge pairs repeat i with repeat i (the paired t of a timing twin, judge/speed.py).

What the partner's repeats measure goes on the cell's row as base_* (the fields a timing twin fills). The
engine's counters its repeats moved (speculation, prefix cache) are kept out of the cell's own figures; its
memory is kept out by the caller, which reads the peak around the cell's own repeats only.
"""

from __future__ import annotations

import time
from typing import Callable

from adapters.base import Adapter
from adapters.contract.disturbance import Disturbance
from adapters.contract.specs import CellSpec
from adapters.contract.timing import TimedRun, summarize

Span = tuple[int, int]


def _plus(total, before, after):
    """total + (after - before), for the engine's counters: a (drafted, accepted) pair or {family: value}."""
    if before is None or after is None:
        return total
    if isinstance(after, dict):
        total = total or {}
        return {k: total.get(k, 0.0) + v - before.get(k, 0.0) for k, v in after.items()}
    return tuple(t + a - b for t, a, b in zip(total or (0,) * len(after), after, before))


def less(after, moved):
    """A counter snapshot without what the partner's repeats added to it."""
    if after is None or moved is None:
        return after
    if isinstance(after, dict):
        return {k: v - moved.get(k, 0.0) for k, v in after.items()}
    return tuple(a - m for a, m in zip(after, moved))


class PartnerTiming:
    """The partner cell's warm-up, then its timed batch once per call (the cell's repeat index), each measured
    as the cell's own are: wall-clock span, host disturbance, throughput."""

    def __init__(self, adapter: Adapter, cell: CellSpec, warm: list[Span], timed: list[Span],
                 generate: Callable[[Span, bool], TimedRun]):
        self.adapter, self.cell, self.warm, self.timed, self.generate = adapter, cell, warm, timed, generate
        self.runs: list[TimedRun] = []
        self.clock: list[tuple[float, float]] = []
        self.host = Disturbance()   # our own process's work (the cell's repeats between) is never counted as others'
        self.spec_moved = None
        self.engine_moved = None
        self.failed: str | None = None   # its batch raised: the cell is timed on alone, its row says why unpaired

    def warm_up(self) -> None:
        for span in self.warm:
            self.generate(span, False)

    def __call__(self, repeat: int) -> None:
        if self.failed:
            return
        spec0, engine0 = self.adapter.spec_counters(), self.adapter.engine_metrics()
        began = time.time()
        try:
            self.runs.append(self.host.measure(lambda: self.generate(self.timed[repeat % len(self.timed)], True)))
        except Exception as err:
            self.failed = f"its baseline's batch, timed in turns with it, failed: {type(err).__name__}: {err}"
            return
        self.clock.append((began, time.time()))
        self.spec_moved = _plus(self.spec_moved, spec0, self.adapter.spec_counters())
        self.engine_moved = _plus(self.engine_moved, engine0, self.adapter.engine_metrics())

    def figures(self) -> dict:
        """The cell's base_* fields (none where the partner's batch failed: `failed` says why)."""
        if self.failed:
            return {}
        host = self.host.figures()
        return {"base_timing_cell": self.cell.cell_id,
                "base_output_tok_s_runs": summarize(self.runs).output_tok_s_runs,
                "base_host_busy_runs": host["host_busy_runs"], "base_gpu_busy_runs": host["gpu_busy_runs"],
                "base_repeat_started_at": [a for a, _ in self.clock],
                "base_repeat_ended_at": [b for _, b in self.clock]}
