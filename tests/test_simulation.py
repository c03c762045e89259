"""The scheduling simulation (benchmarks/simulate_schedule.py) on small instances: the real policy
stays within 10% of the lower bound, no schedule beats the bound, and placement is the real code's."""

import importlib.util
import sys
from pathlib import Path

import pytest

from orchestrator import placement
from orchestrator.matrix import Run
from orchestrator.store import RunStore

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def sim():
    spec = importlib.util.spec_from_file_location("simulate_schedule", ROOT / "benchmarks" / "simulate_schedule.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["simulate_schedule"] = module
    spec.loader.exec_module(module)
    return module


def by_policy(results):
    return {r.policy: r for r in results}


def test_longest_first_is_within_10_percent_of_the_lower_bound_on_64_gpus(sim):
    cluster = sim.default_cluster(64)
    assert sim.total_gpus(cluster) == 64
    groups = sim.synthetic_workload(500, cluster, seed=0)
    assert sum(g.n_cells for g in groups) == 500
    results = by_policy(sim.compare(groups, cluster, seed=0))
    lf = results["longest_first"]
    assert (lf.gpus, lf.cells) == (64, 500)
    assert lf.ratio < 1.10, sim.table(list(results.values()))
    assert lf.makespan <= results["submission (matrix) order"].makespan


def test_longest_first_is_within_10_percent_of_the_lower_bound_on_1000_gpus(sim):
    cluster = sim.default_cluster(1000)
    assert sim.total_gpus(cluster) == 1000
    results = by_policy(sim.compare(sim.synthetic_workload(10_000, cluster, seed=0), cluster, seed=0))
    lf = results["longest_first"]
    assert lf.cells == 10_000 and lf.ratio < 1.10, sim.table(list(results.values()))
    assert lf.makespan < results["random order"].makespan


@pytest.mark.parametrize("gpus,cells,seed",
                         [(64, 500, 0), (64, 500, 3), (64, 2000, 1), (200, 3000, 2), (1000, 10_000, 5)])
def test_no_schedule_beats_the_lower_bound(sim, gpus, cells, seed):
    cluster = sim.default_cluster(gpus)
    groups = sim.synthetic_workload(cells, cluster, seed=seed)
    for r in sim.compare(groups, cluster, seed=seed):
        assert r.makespan >= r.bound * (1 - 1e-9), r
        assert r.makespan >= max(g.duration for g in groups if g.eligible) - 1e-9
        assert 0 < r.busy <= 1 + 1e-9, r


def test_groups_ask_what_placement_says_and_land_only_where_it_fits(sim):
    cluster = sim.default_cluster(64)
    run = Run(env_resources=True)
    for g in sim.synthetic_workload(500, cluster, seed=1):
        assert g.need == placement.group_need(g.framework, {"tensor_parallel_size": g.tp}, run, "cuda", [])
        assert dict(g.need.custom) == {placement.env_resource(g.framework): placement.MARKER}
        assert g.eligible == {t.name for t in cluster if placement.fits(g.need, t.resources())}
        if g.framework == "llamacpp":
            assert g.eligible == {"l4-llamacpp"}
        if g.tp == 8:
            assert "l4-llamacpp" not in g.eligible   # 4 GPUs a node: an 8-GPU group never fits


def test_greedy_list_schedule_on_one_node_is_exact(sim):
    node = [sim.NodeType("h100", 1, 8, 80, 192, ("vllm",))]
    run = Run(env_resources=True)
    groups = []
    for i, (tp, seconds) in enumerate([(8, 10), (4, 6), (4, 4), (4, 3), (4, 3)]):
        g = sim.Group(i, "vllm", "m", 1 << 30, tp, 0.0, [seconds])
        sim._route(g, run, node)
        groups.append(g)
    # t=0 the 8-GPU group holds the node; t=10 the 6 s and 4 s groups; t=14 a 3 s one; t=16 the last
    makespan, used = sim.simulate(groups, node)
    assert makespan == 19
    assert used == 8 * 10 + 4 * (6 + 4 + 3 + 3)
    assert sim.lower_bound(groups, node) == (18.0, "GPU-s / GPUs")
    lost = sim.Group(9, "trtllm", "m", 1 << 30, 1, 0.0, [100.0])
    sim._route(lost, run, node)
    assert lost.eligible == frozenset()   # no node declares env_trtllm: reported, not scheduled
    assert sim.simulate(groups + [lost], node)[0] == 19


def test_durations_can_come_from_a_measured_run(sim, tmp_path):
    store = RunStore(tmp_path / "run")
    rows = [("hf", "e1", 4.0, [2.0, 3.0, 4.0]), ("llamacpp", "e2", 1.0, [1.0, 1.5]),
            ("vllm", "e3", 8.0, [2.0, 2.0, 2.0, 2.0])]
    for fw, key, load, durations in rows:
        for i, d in enumerate(durations):
            store.write_cell({"run_id": "run", "cell_id": f"{key}-{i}", "engine_key": key, "framework": fw,
                              "model": "tiny", "flags_json": '{"tensor_parallel_size": 2}' if fw == "vllm" else "{}",
                              "status": "ok", "load_s": load, "duration_s": d})
    store.write_cell({"run_id": "run", "cell_id": "bad", "engine_key": "e4", "framework": "hf", "model": "tiny",
                      "flags_json": "{}", "status": "failed", "load_s": None, "duration_s": 99.0})
    store.write_manifest({"matrix": {"models": {"tiny": "builtin:tiny"}}})
    cluster = sim.default_cluster(64)
    groups = sim.measured_workload(store.root, 200, cluster, seed=0)
    assert sum(g.n_cells for g in groups) == 200
    measured = {(fw, load, tuple(d)) for fw, _, load, d in rows}
    for g in groups:
        assert (g.framework, g.load_s, tuple(g.cell_s)) in measured or g is groups[-1]   # the last may be cut
        assert g.tp == (2 if g.framework == "vllm" else 1)
        assert g.weight_bytes == placement.model_bytes("builtin:tiny")
    assert 99.0 not in {d for g in groups for d in g.cell_s}   # only ok cells
    for r in sim.compare(groups, cluster):
        assert r.makespan >= r.bound * (1 - 1e-9)
    assert sim.main(["--gpus", "64", "--cells", "100", "--from-run", str(store.root)]) == 0
