"""How long would a large matrix take on a large cluster? A scheduling simulation with the real policy.

Every placement decision goes through the code the scheduler itself runs (orchestrator/placement.py):
`group_need` says what each engine group asks of a node (its GPUs, CPU, env_<framework> marker),
`fits` says whether a node's free resources can take it, `estimate_seconds` and `longest_first` give
the order the groups are submitted in. Around that, an event-driven list schedule stands in for Ray:
whenever a node has free resources it takes the first group in submission order that fits on it
(Ray keeps no reservations: a small group behind a big one starts when it fits), and a group holds
its resources until it ends.

    python benchmarks/simulate_schedule.py                    # 1,000 GPUs, 10,000 cells
    python benchmarks/simulate_schedule.py --gpus 64 --cells 500
    python benchmarks/simulate_schedule.py --from-run results/smoke   # durations measured by a real run

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
  group   = load_s + sum(cell_s)
(GB: weight gigabytes; a duration does not depend on the node it lands on.) The scheduler only
sees `estimate_seconds(weight bytes, number of cells)`, never these draws, so its order is as wrong
as the real estimate is.

With `--from-run DIR` the groups are instead resampled (with replacement) from the engine groups of
a measured run: its frameworks, models, GPU counts (tensor_parallel_size in the cells' engine
options), `load_s` and per-cell `duration_s` come from DIR's cells table, the weight sizes the
estimate sees from `placement.model_bytes` of the run's model sources (as `bench run` computes them).

Lower bound on any schedule's makespan: the largest of total GPU-seconds / GPUs, the longest group,
and, for every set of node types, the GPU-seconds of the groups that can only run on those types
divided by their GPUs (llama.cpp groups, for instance, fit only the L4 nodes).
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

try:
    from orchestrator import placement
except ImportError:  # run from a checkout that is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from orchestrator import placement
from orchestrator.matrix import Run

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


@dataclass
class Group:
    gid: int
    framework: str
    model: str
    weight_bytes: int          # what the estimate sees
    tp: int
    load_s: float
    cell_s: list[float]
    need: placement.Need = None
    eligible: frozenset = frozenset()   # node types it fits on at all

    @property
    def n_cells(self) -> int:
        return len(self.cell_s)

    @property
    def duration(self) -> float:
        return self.load_s + sum(self.cell_s)


@dataclass
class Result:
    policy: str
    gpus: int
    groups: int
    cells: int
    makespan: float
    bound: float
    bound_by: str
    busy: float = 0.0          # GPU-seconds used / (GPUs * makespan)

    @property
    def ratio(self) -> float:
        return self.makespan / self.bound


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


# -- workload ----------------------------------------------------------------------------------

MODELS = {"llama-1b": 1.24e9, "llama-3b": 3.21e9, "llama-8b": 8.03e9, "qwen-14b": 14.8e9,
          "qwen-32b": 32.8e9, "llama-70b": 70.6e9}
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


def synthetic_workload(n_cells: int, cluster: list[NodeType], seed: int = 0, run: Run | None = None) -> list[Group]:
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
                  [base * rng.lognormvariate(0, 0.6) for _ in range(n)])
        _route(g, run, cluster)
        groups.append(g)
        cells += n
    return groups


def measured_workload(run_dir: str | Path, n_cells: int, cluster: list[NodeType], seed: int = 0,
                      run: Run | None = None) -> list[Group]:
    """Engine groups resampled from a measured run's cells table (load_s, duration_s per cell)."""
    import json

    from orchestrator.store import RunStore

    store = RunStore(run_dir)
    df = store.read_cells()
    df = df[(df["status"] == "ok") & df["duration_s"].notna()]
    if df.empty:
        raise SystemExit(f"{run_dir}: no ok cells with a duration_s to draw from")
    sources = {}
    manifest = store.read_manifest()
    for name, entry in (manifest.get("matrix", {}).get("models") or {}).items():
        sources[name] = entry if isinstance(entry, str) else entry.get("source", name)
    measured = []
    for _, cells in df.groupby("engine_key"):
        first = cells.iloc[0]
        options = json.loads(first["flags_json"] or "{}")
        measured.append((first["framework"], first["model"], int(options.get("tensor_parallel_size", 1)),
                         float(first["load_s"]) if first["load_s"] == first["load_s"] else 0.0,
                         [float(d) for d in cells["duration_s"]]))
    return groups_from_measurements(measured, n_cells, cluster, seed, run, sources)


def groups_from_measurements(measured: list[tuple], n_cells: int, cluster: list[NodeType], seed: int = 0,
                             run: Run | None = None, sources: dict | None = None) -> list[Group]:
    """measured: (framework, model, tp, load_s, [duration_s per cell]) per engine group."""
    run = run or Run(env_resources=True)
    rng = random.Random(seed)
    routable = [m for m in measured if any(m[0] in t.frameworks for t in cluster)]
    if not routable:
        raise SystemExit("none of the measured frameworks has an environment in the simulated cluster")
    groups, cells = [], 0
    while cells < n_cells:
        fw, model, tp, load_s, durations = rng.choice(routable)
        n = min(len(durations), n_cells - cells)
        weight = placement.model_bytes((sources or {}).get(model, model))
        g = Group(len(groups), fw, model, weight, tp, load_s, list(durations[:n]))
        _route(g, run, cluster)
        groups.append(g)
        cells += n
    return groups


# -- the schedule ------------------------------------------------------------------------------

def lower_bound(groups: list[Group], cluster: list[NodeType]) -> tuple[float, str]:
    """The largest of: GPU-seconds / GPUs, the longest group, and every node-type pool's own bound."""
    gpus = {t.name: t.count * t.gpus for t in cluster}
    work = sum(g.duration * g.need.gpus for g in groups)
    best = (work / sum(gpus.values()), "GPU-s / GPUs")
    longest = max(groups, key=lambda g: g.duration)
    if longest.duration > best[0]:
        best = (longest.duration, "longest group")
    names = [t.name for t in cluster]
    for k in range(1, len(names)):
        for pool in itertools.combinations(names, k):
            pool_work = sum(g.duration * g.need.gpus for g in groups if g.eligible and g.eligible <= set(pool))
            b = pool_work / sum(gpus[p] for p in pool)
            if b > best[0]:
                best = (b, f"{'+'.join(pool)} GPU-s")
    return best


def simulate(order: list[Group], cluster: list[NodeType]) -> tuple[float, float]:
    """Greedy list schedule in submission order; returns (makespan, GPU-seconds used).

    Groups that no node type can ever host are left out, as `bench run` reports them before starting.
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


def policies(groups: list[Group], seed: int = 0) -> dict[str, list[Group]]:
    """Submission orders: the scheduler's, the same estimate blind to model sizes, two naive ones, an oracle."""
    hub_bytes = placement.model_bytes("org/hub-model-id")   # what bench run sees for a hub id: unknown
    shuffled = list(groups)
    random.Random(seed + 1).shuffle(shuffled)
    return {
        "longest_first": placement.longest_first(
            groups, lambda g: placement.estimate_seconds(g.weight_bytes, g.n_cells)),
        "longest_first, hub ids": placement.longest_first(
            groups, lambda g: placement.estimate_seconds(hub_bytes, g.n_cells)),
        "submission (matrix) order": sorted(groups, key=lambda g: (g.framework, g.model, g.gid)),
        "random order": shuffled,
        # not a policy: the same longest-first order with the true durations, to separate what the
        # estimate costs from what greedy list scheduling and the lower bound's slack cost
        "(oracle) true durations": sorted(groups, key=lambda g: g.duration, reverse=True),
    }


def compare(groups: list[Group], cluster: list[NodeType], seed: int = 0) -> list[Result]:
    placed = [g for g in groups if g.eligible]
    bound, bound_by = lower_bound(placed, cluster)
    gpus = total_gpus(cluster)
    out = []
    for name, order in policies(placed, seed).items():
        makespan, used = simulate(order, cluster)
        out.append(Result(name, gpus, len(placed), sum(g.n_cells for g in placed), makespan, bound, bound_by,
                          busy=used / (gpus * makespan)))
    return out


def table(results: list[Result]) -> str:
    head = (f"{'policy':<26} {'GPUs':>6} {'groups':>7} {'cells':>7} {'makespan s':>11} {'lower bound s':>14} "
            f"{'ratio':>6} {'GPU busy':>9}  bound by")
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(f"{r.policy:<26} {r.gpus:>6} {r.groups:>7} {r.cells:>7} {r.makespan:>11.0f} {r.bound:>14.0f} "
                     f"{r.ratio:>6.3f} {r.busy:>8.1%}  {r.bound_by}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=1000, help="cluster size (the default node mix, scaled)")
    p.add_argument("--cells", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--from-run", metavar="DIR", help="draw groups and durations from a measured run's cells table")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    cluster = default_cluster(a.gpus)
    if a.from_run:
        groups = measured_workload(a.from_run, a.cells, cluster, a.seed)
        source = f"resampled from {a.from_run}"
    else:
        groups = synthetic_workload(a.cells, cluster, a.seed)
        source = "synthetic, model-size durations"
    unplaced = [g for g in groups if not g.eligible]
    print(f"cluster:  {describe_cluster(cluster)}")
    print(f"workload: {sum(g.n_cells for g in groups)} cells in {len(groups)} engine groups "
          f"({source}; seed {a.seed}); GPU-seconds {sum(g.duration * g.need.gpus for g in groups):.3g}")
    if unplaced:
        print(f"          {len(unplaced)} groups fit no node (reported unsupported, not simulated)")
    print()
    results = compare(groups, cluster, a.seed)
    print(table(results))
    print(f"\n({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
