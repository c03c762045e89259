"""How long an engine group will take, before it runs: what the scheduler splits and orders groups by.

A group is one engine load, then its cells one after another. Each part of that is estimated as

  measured   with `bench run --history ROOT`: the same engine config's `load_s` (engine_key) and the
             same cell's `duration_s` (cell_id), the median over the runs under ROOT (the runs
             `bench history ROOT` reads; ids are stable across runs);
  calibrated a config ROOT has not measured, in a run where others of its framework were: its prior
             times the median measured/prior ratio of those (of all frameworks, where none of its own);
  prior      otherwise, from the weights the engine holds per GPU (orchestrator/execution/scheduling/model_size.py) and
             the framework, on CUDA:
               load = fixed[fw] + 1.5 s/GB x GB/GPUs   (+ convert[fw] s/GB x GB: llama.cpp's HF->GGUF, 2)
               cell = (6 s + 0.8 s/GB x GB/GPUs) x speed[fw]
             fixed, speed and the conversion's s/GB are each adapter's declaration (`load_fixed_s`,
             `cell_speed`, `convert_s_per_gb` in its module; hf 10 s, vllm 45 (CUDA graphs, compilation),
             trtllm 120 (engine build), lmdeploy 30, llamacpp 20; speed: trtllm 0.8, vllm 1, lmdeploy 1,
             hf 2.5 (no continuous batching), llamacpp 2; 30 s and 1 for a framework the registry does
             not know). On CPU, loads do not shrink with GPUs and a cell costs 30x per GB. A model
             model_size cannot size is taken to fill each of its GPUs with 16 GB (an 8B model in bf16
             per GPU: a model is sharded over as many GPUs as it needs), 16 GB on CPU.
The priors are round guesses of a GPU cluster's engines (benchmarks/simulate_schedule.py draws its
durations around the same medians); only their ratios matter to the order, and a measured run replaces them.

Each estimate also says how far off it may be (`load_sigma`, `cell_sigma`: log-space standard deviations):
a prior within about 1.35x for a load and 1.8x for a cell (one sigma), a measured duration within about
10% (run-to-run). These spreads are assumed, like the priors (the simulation draws with the same ones);
the dispatcher uses them so that work it knows least about does not start last.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from adapters import ADAPTERS
from adapters.base import Adapter

GB = 1e9
UNKNOWN_GB_PER_GPU = 16.0
LOAD_S_PER_GB = 1.5
CELL_FIXED_S, CELL_S_PER_GB, CPU_CELL_FACTOR = 6.0, 0.8, 30.0
PRIOR_LOAD_SIGMA, PRIOR_CELL_SIGMA, MEASURED_SIGMA = 0.3, 0.6, 0.1   # assumed spreads (log space), see above


@dataclass(frozen=True)
class GroupFacts:
    """What an estimate may know of an engine group (or part of one) before it runs."""

    framework: str
    engine_key: str
    cell_ids: tuple[str, ...]
    weight_bytes: int | None         # None: unknown (model_size could not size it)
    gpus: int = 1
    device: str = "cuda"
    gguf_source: bool = False       # a .gguf file: llama.cpp converts nothing


@dataclass
class Estimate:
    load_s: float
    cell_s: list[float]
    basis: str                      # prior | calibrated prior | measured | partly measured
    load_sigma: float = PRIOR_LOAD_SIGMA
    cell_sigma: list[float] = field(default_factory=list)   # per cell (empty: PRIOR_CELL_SIGMA each)

    def __post_init__(self):
        if not self.cell_sigma:
            self.cell_sigma = [PRIOR_CELL_SIGMA] * len(self.cell_s)

    @property
    def seconds(self) -> float:
        return self.load_s + sum(self.cell_s)


def prior(f: GroupFacts) -> Estimate:
    gpus = max(1, f.gpus) if f.device == "cuda" else 1
    gb = f.weight_bytes / GB if f.weight_bytes is not None else UNKNOWN_GB_PER_GPU * gpus
    per_gpu = gb / gpus
    declared = ADAPTERS.get(f.framework) or Adapter   # the engine's own priors (adapters/base.py: the defaults)
    load = declared.load_fixed_s + LOAD_S_PER_GB * per_gpu
    if not f.gguf_source:   # the engine turns the checkpoint into its own format first (llama.cpp: HF -> GGUF)
        load += declared.convert_s_per_gb * gb
    per_gb = CELL_S_PER_GB * (1 if f.device == "cuda" else CPU_CELL_FACTOR)
    cell = (CELL_FIXED_S + per_gb * per_gpu) * declared.cell_speed
    return Estimate(load, [cell] * len(f.cell_ids), "prior")


@dataclass
class History:
    """Durations earlier runs measured: engine_key -> load_s, cell_id -> duration_s (medians over runs)."""

    load_s: dict[str, float] = field(default_factory=dict)
    cell_s: dict[str, float] = field(default_factory=dict)
    runs: int = 0

    @classmethod
    def read(cls, root: str | Path) -> "History":
        from orchestrator.store.run_store import RunStore
        from orchestrator.store.runs import list_runs

        loads: dict[str, list[float]] = {}
        cells: dict[str, list[float]] = {}
        runs = list_runs(root)
        for path in runs.path:
            t = RunStore(path).read_cells_table(["cell_id", "engine_key", "status", "load_s", "duration_s"])
            per_run_loads: dict[str, list[float]] = {}
            for cid, key, status, load, dur in zip(*(t[c].to_pylist() for c in t.column_names)):
                if status != "ok":
                    continue   # a failed cell's time says little about the next try
                if load is not None and load == load:
                    per_run_loads.setdefault(key, []).append(load)
                if dur is not None and dur == dur:
                    cells.setdefault(cid, []).append(dur)
            for key, values in per_run_loads.items():   # every row of a group repeats its load: one per run
                loads.setdefault(key, []).append(statistics.median(values))
        return cls({k: statistics.median(v) for k, v in loads.items()},
                   {k: statistics.median(v) for k, v in cells.items()}, len(runs))


def _measured(f: GroupFacts, p: Estimate, h: History) -> tuple[Estimate, float | None]:
    """The estimate with what h measured, and measured/prior over the measured parts (None: nothing measured)."""
    load = h.load_s.get(f.engine_key)
    cells = [h.cell_s.get(c) for c in f.cell_ids]
    known = [i for i, c in enumerate(cells) if c is not None]
    if load is None and not known:
        return p, None
    got = (load or 0.0) + sum(cells[i] for i in known)
    want = (p.load_s if load is not None else 0.0) + sum(p.cell_s[i] for i in known)
    ratio = got / want if want > 0 else None
    # cells this run adds to a measured config: the mean of its measured cells, else the prior scaled
    fill = statistics.fmean(cells[i] for i in known) if known else p.cell_s[0] * (ratio or 1.0) if p.cell_s else 0.0
    full = load is not None and len(known) == len(cells)
    return Estimate(load if load is not None else p.load_s * (ratio or 1.0),
                    [c if c is not None else fill for c in cells], "measured" if full else "partly measured",
                    MEASURED_SIGMA if load is not None else PRIOR_LOAD_SIGMA,
                    [MEASURED_SIGMA if c is not None else PRIOR_CELL_SIGMA for c in cells]), ratio


def estimate_groups(facts: list[GroupFacts], history: History | None = None) -> list[Estimate]:
    """One estimate per group, in order; priors are calibrated by what history measured of other groups."""
    priors = [prior(f) for f in facts]
    if history is None or not (history.load_s or history.cell_s):
        return priors
    out, ratios = [], {}
    for f, p in zip(facts, priors):
        e, ratio = _measured(f, p, history)
        out.append(e)
        if ratio:
            ratios.setdefault(f.framework, []).append(ratio)
    everyone = [r for rs in ratios.values() for r in rs]
    for i, (f, e) in enumerate(zip(facts, out)):
        if e.basis == "prior" and everyone:
            k = statistics.median(ratios.get(f.framework) or everyone)
            out[i] = Estimate(e.load_s * k, [c * k for c in e.cell_s], "calibrated prior")
    return out
