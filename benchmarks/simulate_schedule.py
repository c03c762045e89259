"""How long would a large matrix take on a large cluster? A scheduling simulation with the real policy.

The scheduler's own code decides everything: orchestrator/matrix/placement.py says what each engine group
asks of a node (`group_need`: its GPUs, CPU, env_<framework> marker) and where it fits (`fits`);
orchestrator/execution/scheduling/estimate.py estimates each group from what `bench run` would know of it (framework,
weight bytes, tensor-parallel size; with history, what an earlier run measured); and
orchestrator/execution/scheduling/dispatch.py cuts the groups that would bind the makespan into parts, homes each part on
a node type, and says which part starts on which node whenever one frees up, as `bench run` does on
Ray (it pins each part to its node). Around that, an event loop stands in for the cluster: a part
holds its resources for its true duration, which the dispatcher never sees.

    python benchmarks/simulate_schedule.py                    # 1,000 GPUs, 10,000 cells
    python benchmarks/simulate_schedule.py --cells 50000
    python benchmarks/simulate_schedule.py --gpus 64 --cells 2000 --seed 3
    python benchmarks/simulate_schedule.py --from-run results/smoke   # durations measured by a real run
    python benchmarks/simulate_schedule.py --quick            # 32 GPUs, 300 cells (CI, seconds)

Default workload (seeded, `--seed`): engine groups of 6-16 cells are drawn for five frameworks and
six models of 1B-70B parameters in the quantizations each framework runs; a group's GPU count (its
tensor-parallel size) is the smallest of 1/2/4/8 whose memory holds 1.3x the weights on the
smallest GPU of every node type the group can land on (Ray routes by GPU count, not memory), and
sometimes twice that. Durations, per group:
  load_s  = (fixed[fw] + 1.5 s * GB / tp) * LogNormal(0, 0.3)     fixed: hf 10, vllm 45, trtllm 120,
                                                                   lmdeploy 30, llamacpp 20 (+2 s/GB
                                                                   GGUF conversion) seconds
  cell_s  = (6 s + 0.8 s * GB / tp) * speed[fw] * LogNormal(0, 0.6), per cell
            speed: trtllm 0.8, vllm 1.0, lmdeploy 1.0, hf 2.5, llamacpp 2.0 (on L4)
  group   = load_s + sum(cell_s); a part of a split group pays the same load_s again
(GB: weight gigabytes; a duration does not depend on the node it lands on.) The estimate's priors are
these medians: what the simulation measures is how much the unseen spread (and, for hub ids, the
unknown size) costs. An earlier run of the same configurations (the `history` policy, as `bench run
--history ROOT` reads one) measured every load and cell at its true duration x LogNormal(0,
--history-noise), run-to-run variation.

With `--from-run DIR` the groups are instead resampled (with replacement) from the engine groups of
a measured run: its frameworks, models, GPU counts (tensor_parallel_size in the cells' engine
options), `load_s` and per-cell `duration_s` come from DIR's cells table, the weight sizes the
estimate sees from `model_size.weight_bytes` of the run's model sources (as `bench run` computes them).

Two lower bounds on the makespan, from the true durations:
  whole groups  the largest of total GPU-seconds / GPUs, the longest group, and, for every set of node
                types, the GPU-seconds of the groups that can only run on those types over their GPUs
                (llama.cpp groups, for instance, fit only the L4 nodes): no schedule that runs each group
                in one piece beats it.
  split groups  no schedule beats it even cutting groups anywhere: the smallest T no shorter than any
                one cell plus its group's load such that every pool's GPU-seconds fit in T, each group
                counted with the loads of the fewest parts that finish by T (every part loads the
                engine: ceil(cells' seconds / (T - load)) parts at least).
The `today` policies (the scheduler before groups could be split: one Ray task per group, submitted
longest first by `size x cells`, Ray starting whichever fits) run whole groups; the `split` ones run
the dispatcher. Each row shows its makespan against both bounds.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import heapq
import itertools
import json
import math
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

# this checkout's scheduler, not whichever lossless-bench is installed
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from orchestrator.execution.scheduling import model_size
from orchestrator.execution.scheduling.dispatch import Dispatcher, Progress, Work  # noqa: E402
from orchestrator.execution.scheduling.estimate import GroupFacts, History, estimate_groups  # noqa: E402
from orchestrator.matrix import placement  # noqa: E402
from orchestrator.matrix.models import Run  # noqa: E402
from orchestrator.store.schema import json_object  # noqa: E402

GB = 1e9


@dataclass(frozen=True)
class NodeType:
    name: str
    count: int
    gpus: int
    gpu_mem_gb: float
    cpus: int
    frameworks: tuple[str, ...]

    def resources(self) -> dict[str, float]:
        """What a node of this type declares to Ray: CPU, GPU and env_<framework> for each environment it has."""
        return {"CPU": self.cpus, "GPU": self.gpus, **{placement.env_resource(f): 1000 for f in self.frameworks}}


@dataclass(eq=False)
class Group:
    gid: int
    framework: str
    model: str
    weight_bytes: int          # what the estimate sees for a local checkpoint
    tp: int
    load_s: float
    cell_s: list[float]
    need: placement.Need = None
    eligible: frozenset = frozenset()   # node types it fits on at all
    hub_id: str | None = None           # the model as a hub id (the `hub ids` policies)
    quantization: str | None = None
    history_load_s: float | None = None                  # what an earlier run measured
    history_cell_s: list[float] = field(default_factory=list)

    @property
    def n_cells(self) -> int:
        return len(self.cell_s)

    @property
    def duration(self) -> float:
        return self.load_s + sum(self.cell_s)

    @property
    def engine_key(self) -> str:
        return f"g{self.gid}"

    def cell_ids(self) -> tuple[str, ...]:
        return tuple(f"g{self.gid}-{i}" for i in range(self.n_cells))


@dataclass
class Result:
    policy: str
    gpus: int
    groups: int
    parts: int
    cells: int
    makespan: float
    bound: float               # whole groups
    bound_split: float         # groups split anywhere
    busy: float = 0.0          # GPU-seconds used / (GPUs * makespan)

    @property
    def ratio(self) -> float:
        return self.makespan / self.bound

    @property
    def ratio_split(self) -> float:
        return self.makespan / self.bound_split


# -- cluster -----------------------------------------------------------------------------------

# The default mix, per 1,000 GPUs: 75 nodes of 8xH100 with vllm, trtllm and hf; 25 of 8xH100 with
# lmdeploy and hf; 50 of 4xL4 with hf and llama.cpp.
MIX = (("h100-vllm-trtllm", 0.6, 8, 80, 192, ("vllm", "trtllm", "hf")),
       ("h100-lmdeploy", 0.2, 8, 80, 192, ("lmdeploy", "hf")),
       ("l4-llamacpp", 0.2, 4, 24, 48, ("llamacpp", "hf")))


def default_cluster(gpus: int = 1000) -> list[NodeType]:
    """The default mix scaled to about `gpus` GPUs (at least one node of each type)."""
    out, left = [], gpus
    for i, (name, share, per_node, mem, cpus, fws) in enumerate(MIX):
        want = left if i == len(MIX) - 1 else gpus * share   # the last type takes what is left
        n = max(1, round(want / per_node))
        out.append(NodeType(name, n, per_node, mem, cpus, fws))
        left -= n * per_node
    return out


def total_gpus(cluster: list[NodeType]) -> int:
    return sum(t.count * t.gpus for t in cluster)


def describe_cluster(cluster: list[NodeType]) -> str:
    parts = [f"{t.count} x {t.gpus}x{t.name.split('-')[0].upper()} {{{','.join(sorted(t.frameworks))}}}"
             for t in cluster]
    return ", ".join(parts) + f" = {total_gpus(cluster)} GPUs"


def cluster_nodes(cluster: list[NodeType]) -> dict[str, dict[str, float]]:
    return {f"{t.name}-{i}": t.resources() for t in cluster for i in range(t.count)}


# -- workload ----------------------------------------------------------------------------------

MODELS = {"llama-1b": 1.24e9, "llama-3b": 3.21e9, "llama-8b": 8.03e9, "qwen-14b": 14.8e9,
          "qwen-32b": 32.8e9, "llama-70b": 70.6e9}
# The same models as hub ids, with the architecture their config.json gives (the `hub ids` policies
# size them from these files, through model_size, as `bench run` does from the Hugging Face cache).
HUB = {"llama-1b": ("meta-llama/Llama-3.2-1B", "llama", 2048, 16, 8192, 32, 128256, True),
       "llama-3b": ("meta-llama/Llama-3.2-3B", "llama", 3072, 28, 8192, 24, 128256, True),
       "llama-8b": ("meta-llama/Llama-3.1-8B", "llama", 4096, 32, 14336, 32, 128256, False),
       "qwen-14b": ("Qwen/Qwen2.5-14B", "qwen2", 5120, 48, 13824, 40, 152064, False),
       "qwen-32b": ("Qwen/Qwen2.5-32B", "qwen2", 5120, 64, 27648, 40, 152064, False),
       "llama-70b": ("meta-llama/Llama-3.1-70B", "llama", 8192, 80, 28672, 64, 128256, False)}
BYTES_PER_PARAM = {"bf16": 2.0, "fp8": 1.0, "awq": 0.56, "q8_0": 1.06, "q4_k_m": 0.6}
QUANTS = {"hf": ("bf16",), "vllm": ("bf16", "fp8", "awq"), "trtllm": ("bf16", "fp8"),
          "lmdeploy": ("bf16", "awq"), "llamacpp": ("q8_0", "q4_k_m")}
FRAMEWORK_SHARE = {"vllm": 0.3, "trtllm": 0.2, "hf": 0.2, "lmdeploy": 0.15, "llamacpp": 0.15}
LOAD_FIXED_S = {"hf": 10, "vllm": 45, "trtllm": 120, "lmdeploy": 30, "llamacpp": 20}
CELL_SPEED = {"trtllm": 0.8, "vllm": 1.0, "lmdeploy": 1.0, "hf": 2.5, "llamacpp": 2.0}
CELLS_PER_GROUP = (6, 8, 12, 16)    # batch sizes x (input, output) lengths of one engine config


def _route(g: Group, run: Run, cluster: list[NodeType]) -> None:
    g.need = placement.group_need(g.framework, {"tensor_parallel_size": g.tp}, run, "cuda", [])
    g.eligible = frozenset(t.name for t in cluster if placement.fits(g.need, t.resources()))


def _min_tp(weight_gb: float, mem_gb: float) -> int | None:
    for tp in (1, 2, 4, 8):
        if 1.3 * weight_gb <= tp * mem_gb:
            return tp
    return None


def _measure_history(groups: list[Group], seed: int, noise: float) -> None:
    """An earlier run of the same configurations: each load and cell as it really takes, x run-to-run noise.
    Its own random stream, so the workload's draws are the same with or without it."""
    rng = random.Random(seed + 1_000_003)
    for g in groups:
        g.history_load_s = g.load_s * rng.lognormvariate(0, noise)
        g.history_cell_s = [c * rng.lognormvariate(0, noise) for c in g.cell_s]


def synthetic_workload(n_cells: int, cluster: list[NodeType], seed: int = 0, run: Run | None = None,
                       history_noise: float = 0.1) -> list[Group]:
    """Engine groups totalling exactly n_cells, with durations from the model documented above."""
    run = run or Run(env_resources=True)
    rng = random.Random(seed)
    groups: list[Group] = []
    cells = 0
    frameworks = [f for f in FRAMEWORK_SHARE if any(f in t.frameworks for t in cluster)]
    weights = [FRAMEWORK_SHARE[f] for f in frameworks]
    while cells < n_cells:
        fw = rng.choices(frameworks, weights)[0]
        hosts = [t for t in cluster if fw in t.frameworks]
        mem = min(t.gpu_mem_gb for t in hosts)
        max_gpus = max(t.gpus for t in hosts)
        model = rng.choice(list(MODELS))
        quant = rng.choice(QUANTS[fw])
        weight_gb = MODELS[model] * BYTES_PER_PARAM[quant] / GB
        tp = _min_tp(weight_gb, mem)
        if tp is None or tp > max_gpus:
            continue   # this model does not fit this framework's nodes in this quantization: not a cell
        if tp * 2 <= max_gpus and fw in ("vllm", "trtllm", "lmdeploy") and rng.random() < 0.3:
            tp *= 2    # a flag set that tries a larger tensor-parallel size
        n = min(rng.choice(CELLS_PER_GROUP), n_cells - cells)
        per_gpu_gb = weight_gb / tp
        load = (LOAD_FIXED_S[fw] + 1.5 * per_gpu_gb + (2 * weight_gb if fw == "llamacpp" else 0)) \
            * rng.lognormvariate(0, 0.3)
        base = (6 + 0.8 * per_gpu_gb) * CELL_SPEED[fw]
        g = Group(len(groups), fw, f"{model}-{quant}", int(weight_gb * GB), tp, load,
                  [base * rng.lognormvariate(0, 0.6) for _ in range(n)], hub_id=HUB[model][0], quantization=quant)
        _route(g, run, cluster)
        groups.append(g)
        cells += n
    _measure_history(groups, seed, history_noise)
    return groups


def measured_workload(run_dir: str | Path, n_cells: int, cluster: list[NodeType], seed: int = 0,
                      run: Run | None = None, history_noise: float = 0.1) -> list[Group]:
    """Engine groups resampled from a measured run's cells table (load_s, duration_s per cell)."""
    from orchestrator.store.run_store import RunStore

    store = RunStore(run_dir)
    df = store.read_cells()
    df = df[(df["status"] == "ok") & df["duration_s"].notna()]
    if df.empty:
        raise SystemExit(f"{run_dir}: no ok cells with a duration_s to draw from")
    sources = {}
    stored = store.read_manifest().to_json()["matrix"]
    for name, entry in (stored.get("models") or {}).items():
        sources[name] = entry if isinstance(entry, str) else entry.get("source", name)
    measured = []
    for _, cells in df.groupby("engine_key"):
        first = cells.iloc[0]
        options = json_object(first["flags_json"])
        measured.append((first["framework"], first["model"], placement.engine_gpus(options),
                         float(first["load_s"]) if first["load_s"] == first["load_s"] else 0.0,
                         [float(d) for d in cells["duration_s"]], first.get("quantization")))
    return groups_from_measurements(measured, n_cells, cluster, seed, run, sources, history_noise)


def groups_from_measurements(measured: list[tuple], n_cells: int, cluster: list[NodeType], seed: int = 0,
                             run: Run | None = None, sources: dict | None = None,
                             history_noise: float = 0.1) -> list[Group]:
    """measured: (framework, model, tp, load_s, [duration_s per cell][, quantization]) per engine group."""
    run = run or Run(env_resources=True)
    rng = random.Random(seed)
    routable = [m for m in measured if any(m[0] in t.frameworks for t in cluster)]
    if not routable:
        raise SystemExit("none of the measured frameworks has an environment in the simulated cluster")
    groups, cells = [], 0
    while cells < n_cells:
        fw, model, tp, load_s, durations, *quant = rng.choice(routable)
        n = min(len(durations), n_cells - cells)
        source = (sources or {}).get(model, model)
        quant = quant[0] if quant else None
        weight = model_size.weight_bytes(source, quant)[0]
        g = Group(len(groups), fw, model, weight, tp, load_s, list(durations[:n]), hub_id=source, quantization=quant)
        _route(g, run, cluster)
        groups.append(g)
        cells += n
    _measure_history(groups, seed, history_noise)
    return groups


# -- bounds --------------------------------------------------------------------------------------

def _pool_bound(groups: list[Group], cluster: list[NodeType], seconds) -> tuple[float, str]:
    gpus = {t.name: t.count * t.gpus for t in cluster}
    best = (sum(seconds(g) * g.need.gpus for g in groups) / sum(gpus.values()), "GPU-s / GPUs")
    names = [t.name for t in cluster]
    for k in range(1, len(names)):
        for pool in itertools.combinations(names, k):
            pool_work = sum(seconds(g) * g.need.gpus for g in groups if g.eligible and g.eligible <= set(pool))
            b = pool_work / sum(gpus[p] for p in pool)
            if b > best[0]:
                best = (b, f"{'+'.join(pool)} GPU-s")
    return best


def lower_bound(groups: list[Group], cluster: list[NodeType]) -> tuple[float, str]:
    """Whole groups: the largest of GPU-seconds / GPUs, the longest group, and every node-type pool's own bound."""
    best = _pool_bound(groups, cluster, lambda g: g.duration)
    longest = max(g.duration for g in groups)
    return (longest, "longest group") if longest > best[0] else best


def split_lower_bound(groups: list[Group], cluster: list[NodeType]) -> tuple[float, str]:
    """Groups cut anywhere: the smallest T that every pool's GPU-seconds fit in, each group counted with
    the loads its cuts need to finish by T (every part pays a load, so ceil(cells' seconds / (T - load))
    parts at least), and no shorter than one cell plus its group's load."""
    single = max(g.load_s + max(g.cell_s) for g in groups)

    def pools_at(t: float) -> tuple[float, str]:
        return _pool_bound(groups, cluster, lambda g: g.load_s * math.ceil(sum(g.cell_s) / (t - g.load_s) - 1e-9)
                           + sum(g.cell_s) if t > g.load_s else math.inf)

    if pools_at(single)[0] <= single:
        return single, "one cell + its load"
    lo, hi = single, max(single, pools_at(single * 2)[0], 1.0) * 2
    while pools_at(hi)[0] > hi:
        hi *= 2
    for _ in range(60):   # the pools' work only falls as T grows: bisect to the fixed point
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if pools_at(mid)[0] <= mid else (mid, hi)
    return hi, f"{pools_at(hi)[1]}, cuts' loads counted"


# -- today's scheduler: whole groups, longest first by size x cells, Ray's greedy placement -------------------

def today_estimate(weight_bytes: int, n_cells: int) -> float:
    """The estimate before orchestrator/execution/scheduling/estimate.py: loading and each cell grow with the weights, nothing else."""
    gb = weight_bytes / GB
    return 5.0 + 10.0 * gb + n_cells * (5.0 + 5.0 * gb)


def simulate(order: list[Group], cluster: list[NodeType]) -> tuple[float, float]:
    """Ray's greedy list schedule in submission order, whole groups; returns (makespan, GPU-seconds used).

    Whenever a node has free resources it takes the first group in submission order that fits on it
    (Ray keeps no reservations). Groups that no node type can ever host are left out, as `bench run`
    reports them before starting.
    """
    nodes = []      # (type index, free resources)
    for ti, t in enumerate(cluster):
        nodes += [(ti, t.resources()) for _ in range(t.count)]
    # one queue per distinct need (a handful), in submission order: a free node looks at the head of
    # each queue whose need could ever fit it and takes the earliest submitted one that fits now
    rank = {id(g): i for i, g in enumerate(order)}
    queues: dict[placement.Need, list[Group]] = {}
    for g in order:
        if g.eligible:
            queues.setdefault(g.need, []).append(g)
    heads = {need: 0 for need in queues}
    by_type = [[need for need in queues if placement.fits(need, t.resources())] for t in cluster]
    events: list[tuple[float, int, int, Group]] = []
    seq = itertools.count()
    used = 0.0

    def fill(ni: int, now: float) -> None:
        nonlocal used
        ti, free = nodes[ni]
        while True:
            best = None
            for need in by_type[ti]:
                q, h = queues[need], heads[need]
                if h < len(q) and (best is None or rank[id(q[h])] < rank[id(best)]) and placement.fits(need, free):
                    best = q[h]
            if best is None:
                return
            heads[best.need] += 1
            for k, v in best.need.as_resources().items():
                free[k] = free.get(k, 0) - v
            used += best.duration * best.need.gpus
            heapq.heappush(events, (now + best.duration, next(seq), ni, best))

    for ni in range(len(nodes)):
        fill(ni, 0.0)
    makespan = 0.0
    while events:
        now, _, ni, g = heapq.heappop(events)
        makespan = now
        free = nodes[ni][1]
        for k, v in g.need.as_resources().items():
            free[k] += v
        fill(ni, now)
    return makespan, used


# -- the scheduler now: estimates, split parts, dispatch -------------------------------------------

@contextlib.contextmanager
def hub_cache(groups: list[Group]):
    """A Hugging Face cache holding only the config.json of each hub model (no weights), for model_size."""
    with tempfile.TemporaryDirectory(prefix="sim-hf-cache-") as root:
        for repo, arch, hidden, layers, inner, heads, vocab, tied in HUB.values():
            snap = Path(root) / ("models--" + repo.replace("/", "--")) / "snapshots" / "0"
            snap.mkdir(parents=True)
            (snap / "config.json").write_text(json.dumps({
                "model_type": arch, "hidden_size": hidden, "num_hidden_layers": layers, "intermediate_size": inner,
                "num_attention_heads": heads, "num_key_value_heads": 8, "vocab_size": vocab,
                "tie_word_embeddings": tied, "hidden_act": "silu", "torch_dtype": "bfloat16"}))
        old = os.environ.get("HF_HUB_CACHE")
        os.environ["HF_HUB_CACHE"] = root
        model_size.weight_bytes.cache_clear()
        try:
            yield
        finally:
            model_size.weight_bytes.cache_clear()
            if old is None:
                os.environ.pop("HF_HUB_CACHE")
            else:
                os.environ["HF_HUB_CACHE"] = old


def estimates(groups: list[Group], sizing: str = "local", history: bool = False) -> list:
    """What the scheduler estimates per group. sizing: local (checkpoint sizes), config (hub ids, sized from
    their config.json), unknown (hub ids the estimate cannot size). history: an earlier run's measurements."""
    def size(g: Group) -> int | None:
        if sizing == "local":
            return g.weight_bytes
        if sizing == "config" and g.hub_id:
            return model_size.weight_bytes(g.hub_id, g.quantization)[0]
        return None

    facts = [GroupFacts(g.framework, g.engine_key, g.cell_ids(), size(g), g.tp) for g in groups]
    measured = None
    if history:
        measured = History({g.engine_key: g.history_load_s for g in groups},
                           {c: d for g in groups for c, d in zip(g.cell_ids(), g.history_cell_s)}, 1)
    return estimate_groups(facts, measured)


def simulate_dispatch(groups: list[Group], cluster: list[NodeType], loads_cells: list[tuple],
                      split: bool = True, steal: bool = True) -> tuple[float, float, int]:
    """The dispatcher with these per-group estimates (load, cells[, load sigma, cell sigmas]: how far off
    they may be; none: exact) against the true durations;
    returns (makespan, GPU-seconds used, parts run). With `steal`, whenever parts end (and so at every
    point where the driver looks), the driver's progress of each running part (Progress: its load and
    finished cells as measured, the running cell's start) goes to the dispatcher's `steal`, as the
    scheduler passes what the parts' tasks report; a withdrawal takes effect at once (the real one
    waits for the victim's next poll, under a second, against cells of many seconds)."""
    works = [Work(g, g.need, load, tuple(cells), load_sigma=spread[0] if spread else 0.0,
                  cell_sigma=tuple(spread[1]) if spread else ()) for g, (load, cells, *spread) in zip(groups, loads_cells)]
    d = Dispatcher(cluster_nodes(cluster), works, split_groups=split, steal_cells=steal)
    events, seq, used, makespan, parts = [], itertools.count(), 0.0, 0.0, 0
    began: dict[Work, float] = {}
    version: dict[Work, int] = {}
    ran: dict[tuple[int, int], int] = {}     # (group, cell) -> times run: exactly once, stolen or not

    def end_of(part: Work) -> float:
        g = part.key
        return began[part] + g.load_s + sum(g.cell_s[i] for i in part.cells)   # the truth, hidden from d

    # per running part: when its load ends, when each of its cells does (summed in its order, as the truth
    # unfolds) and those cells' seconds; pushed anew when a steal shortens it. What the driver has seen
    # changes only when a load or a cell ends: the same Progress until then.
    stamps: dict[Work, tuple[float, list[float], list[float]]] = {}
    seen: dict[Work, tuple[int, Progress]] = {}

    def progress(part: Work, now: float) -> Progress:
        t, ends, seconds = stamps[part]
        k = -1 if now < t else bisect.bisect_right(ends, now)   # cells done by now (-1: loading); ends only grow
        last = seen.get(part)
        if last is not None and last[0] == k:
            return last[1]
        if k < 0:
            pr = Progress(began[part])
        elif k < len(ends):
            pr = Progress(began[part], part.key.load_s, seconds[:k], ends[k - 1] if k else t)
        else:
            pr = Progress(began[part], part.key.load_s, list(seconds))
        seen[part] = (k, pr)
        return pr

    changes: list[tuple[float, int, int, Work]] = []   # when a running part's progress next changes
    change_seq = itertools.count()

    def track(part: Work, now: float) -> None:
        """Its progress as of now (in `seen`), and when that changes next: its load ends or a cell does."""
        progress(part, now)
        k = seen[part][0]
        t, ends, _ = stamps[part]
        if k < len(ends):
            heapq.heappush(changes, (t if k < 0 else ends[k], next(change_seq), version[part], part))

    def progress_now(now: float) -> dict[Work, Progress]:
        """Every running part's progress, as `progress` says, looking again only at those that changed."""
        while changes and changes[0][0] <= now:
            _, _, v, part = heapq.heappop(changes)
            if v == version[part] and part in d.running:
                track(part, now)
        return {p: seen[p][1] for p in d.running}

    def push(part: Work, now: float) -> None:
        version[part] = version.get(part, 0) + 1
        g = part.key
        t = began[part] + g.load_s
        ends, seconds = [], [g.cell_s[i] for i in part.cells]
        for c in seconds:
            t += c
            ends.append(t)
        stamps[part] = (began[part] + g.load_s, ends, seconds)
        seen.pop(part, None)
        track(part, now)
        heapq.heappush(events, (end_of(part), next(seq), version[part], part))

    def run(part: Work, now: float) -> None:
        nonlocal parts
        began[part] = now
        parts += 1
        push(part, now)

    def start(now: float) -> None:
        for part, _ in d.step():
            run(part, now)
        if steal and d.can_steal():
            for victim, cells, node in d.steal(now, progress_now(now)):
                thief = d.stolen(victim, cells, node)   # nothing of the tail has begun: all of it is withdrawn
                push(victim, now)                       # it ends sooner now
                run(thief, now)

    start(0.0)
    while events:
        now, _, v, part = heapq.heappop(events)
        if v != version[part]:
            continue
        makespan = now
        used += (now - began[part]) * part.need.gpus
        for i in part.cells:
            ran[(part.key.gid, i)] = ran.get((part.key.gid, i), 0) + 1
        d.finished(part, progress(part, now))
        start(now)
    assert len(ran) == sum(g.n_cells for g in groups) and set(ran.values()) == {1}, "a cell ran twice or never"
    return makespan, used, parts


def policies(groups: list[Group], seed: int = 0) -> dict:
    """name -> ('today', submission order) or ('split', per-group (load, cells) estimates)."""
    shuffled = list(groups)
    random.Random(seed + 1).shuffle(shuffled)
    hub_1gb = model_size.UNKNOWN_BYTES   # what today's estimate took for a hub id
    with hub_cache(groups):
        from_config = estimates(groups, "config")

    def pairs(es):
        return [(e.load_s, e.cell_s, e.load_sigma, e.cell_sigma) for e in es]

    return {
        "today: longest_first": ("today", sorted(groups, key=lambda g: today_estimate(g.weight_bytes, g.n_cells),
                                                 reverse=True)),
        "today: longest, hub ids": ("today", sorted(groups, key=lambda g: today_estimate(hub_1gb, g.n_cells),
                                                    reverse=True)),
        "today: submission order": ("today", sorted(groups, key=lambda g: (g.framework, g.model, g.gid))),
        "today: random order": ("today", shuffled),
        "split: priors": ("split", pairs(estimates(groups))),
        "split: hub ids, config": ("split", pairs(from_config)),
        "split: hub ids, unsized": ("split", pairs(estimates(groups, "unknown"))),
        "split: history": ("split", pairs(estimates(groups, history=True))),
        # not a policy: the dispatcher given the true durations, to separate what the estimate costs
        # from what the dispatcher's own rules and the lower bound's slack cost
        "(oracle) split: true": ("split", [(g.load_s, list(g.cell_s)) for g in groups]),
    }


def compare(groups: list[Group], cluster: list[NodeType], seed: int = 0, only: list[str] | None = None,
            steal: bool = True) -> list[Result]:
    placed = [g for g in groups if g.eligible]
    bound, _ = lower_bound(placed, cluster)
    bound_split, _ = split_lower_bound(placed, cluster)
    gpus = total_gpus(cluster)
    out = []
    for name, (kind, plan) in policies(placed, seed).items():
        if only and name not in only:
            continue
        if kind == "today":
            (makespan, used), parts = simulate(plan, cluster), len(placed)
        else:
            makespan, used, parts = simulate_dispatch(placed, cluster, plan, steal=steal)
        out.append(Result(name, gpus, len(placed), parts, sum(g.n_cells for g in placed), makespan, bound,
                          bound_split, busy=used / (gpus * makespan)))
    return out


def table(results: list[Result]) -> str:
    head = (f"{'policy':<26} {'GPUs':>5} {'groups':>6} {'parts':>6} {'makespan s':>10} "
            f"{'/whole bound':>12} {'/split bound':>12} {'GPU busy':>8}")
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(f"{r.policy:<26} {r.gpus:>5} {r.groups:>6} {r.parts:>6} {r.makespan:>10.0f} "
                     f"{r.ratio:>12.3f} {r.ratio_split:>12.3f} {r.busy:>8.1%}")
    return "\n".join(lines)


def seeds_table(by_seed: dict[int, list[Result]]) -> str:
    """Per policy: makespan / split-groups bound for each seed, and the worst; whole-groups ratios in brackets."""
    seeds = list(by_seed)
    head = f"{'policy':<26} " + " ".join(f"{'seed ' + str(s):>13}" for s in seeds) + f" {'worst':>13}"
    lines = [head, "-" * len(head)]
    for i, r0 in enumerate(by_seed[seeds[0]]):
        rs = [by_seed[s][i] for s in seeds]
        cells = [f"{r.ratio_split:.3f} ({r.ratio:.2f})" for r in rs]
        worst = max(rs, key=lambda r: r.ratio_split)
        lines.append(f"{r0.policy:<26} " + " ".join(f"{c:>13}" for c in cells)
                     + f" {f'{worst.ratio_split:.3f} ({worst.ratio:.2f})':>13}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=1000, help="cluster size (the default node mix, scaled)")
    p.add_argument("--cells", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", metavar="A-B", help="several workloads (seeds A..B): each policy's ratios, one column a seed")
    p.add_argument("--history-noise", type=float, default=0.1,
                   help="sigma of the run-to-run LogNormal between the earlier run's measurements and the truth")
    p.add_argument("--no-steal", action="store_true", help="the dispatcher without run-time work stealing (run.steal_cells: false)")
    p.add_argument("--from-run", metavar="DIR", help="draw groups and durations from a measured run's cells table")
    p.add_argument("--quick", action="store_true", help="32 GPUs, 300 cells, for CI (seconds)")
    a = p.parse_args(argv)
    if a.quick:
        a.gpus, a.cells = 32, 300
    t0 = time.perf_counter()
    cluster = default_cluster(a.gpus)
    if a.seeds:
        first, last = (int(x) for x in a.seeds.split("-"))
        print(f"cluster:  {describe_cluster(cluster)}; {a.cells} cells, seeds {first}-{last}\n")
        print(seeds_table({seed: compare(synthetic_workload(a.cells, cluster, seed, history_noise=a.history_noise),
                                         cluster, seed, steal=not a.no_steal) for seed in range(first, last + 1)}))
        print(f"\n({time.perf_counter() - t0:.1f} s)")
        return 0
    if a.from_run:
        groups = measured_workload(a.from_run, a.cells, cluster, a.seed, history_noise=a.history_noise)
        source = f"resampled from {a.from_run}"
    else:
        groups = synthetic_workload(a.cells, cluster, a.seed, history_noise=a.history_noise)
        source = "synthetic, model-size durations"
    unplaced = [g for g in groups if not g.eligible]
    placed = [g for g in groups if g.eligible]
    print(f"cluster:  {describe_cluster(cluster)}")
    print(f"workload: {sum(g.n_cells for g in groups)} cells in {len(groups)} engine groups "
          f"({source}; seed {a.seed}); GPU-seconds {sum(g.duration * g.need.gpus for g in groups):.3g}")
    if unplaced:
        print(f"          {len(unplaced)} groups fit no node (reported unsupported, not simulated)")
    (b, by), (bs, bys) = lower_bound(placed, cluster), split_lower_bound(placed, cluster)
    print(f"bounds:   whole groups {b:.0f} s ({by}); split groups {bs:.0f} s ({bys})")
    print()
    print(table(compare(groups, cluster, a.seed, steal=not a.no_steal)))
    print(f"\n({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
