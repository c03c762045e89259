"""The scheduling simulation (benchmarks/simulate_schedule.py): the scheduler's own estimate and dispatcher
against drawn durations it never sees; no schedule beats either lower bound; placement is the real code's.

The numbers asserted are the ones benchmarks/README.md reports, with a little room for floating point."""

import importlib.util
import sys

import pytest

from orchestrator.matrix import placement
from orchestrator.matrix.models import Run
from orchestrator.store.run_store import RunStore
from tests.helpers import ROOT

SPLIT = ["split: priors", "split: hub ids, config", "split: hub ids, unsized", "split: history", "(oracle) split: true"]


@pytest.fixture(scope="module")
def sim():
    spec = importlib.util.spec_from_file_location("simulate_schedule", ROOT / "benchmarks" / "simulate_schedule.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["simulate_schedule"] = module
    spec.loader.exec_module(module)
    return module


def by_policy(results):
    return {r.policy: r for r in results}


def test_a_lightly_loaded_cluster_is_not_worse_off_for_splitting(sim):
    cluster = sim.default_cluster(64)
    assert sim.total_gpus(cluster) == 64
    groups = sim.synthetic_workload(500, cluster, seed=0)     # 48 groups on 64 GPUs: the longest one binds
    assert sum(g.n_cells for g in groups) == 500
    results = by_policy(sim.compare(groups, cluster, seed=0))
    s = results["split: priors"]
    assert (s.gpus, s.cells) == (64, 500)
    assert s.ratio < 1.0 and s.makespan <= results["today: longest_first"].makespan, sim.table(list(results.values()))


# at the scale of a large cluster: seconds each, so in the full suite (`make test`), not the fast loop
@pytest.mark.slow
def test_10000_cells_on_1000_gpus_splitting_beats_the_whole_group_bound(sim):
    cluster = sim.default_cluster(1000)
    results = by_policy(sim.compare(sim.synthetic_workload(10_000, cluster, seed=0), cluster, seed=0))
    table = sim.table(list(results.values()))
    today = results["today: longest_first"]
    assert today.cells == 10_000 and today.ratio == pytest.approx(1.058, abs=0.001), table   # as before
    assert today.bound == pytest.approx(1225, abs=1) and today.bound_split == pytest.approx(812, abs=1)
    for name in SPLIT[:2]:
        assert results[name].ratio < 0.92 and results[name].parts > results[name].groups, table
    # the goal, 1.05 of the split bound, is not met here, not even with the true durations: see
    # benchmarks/README.md (priors 1.256, history 1.100, true durations 1.065)
    assert results["split: priors"].ratio_split < 1.265 and results["split: history"].ratio_split < 1.11, table
    assert results["(oracle) split: true"].ratio_split < 1.075, table


# at the scale of a large cluster: seconds each, so in the full suite (`make test`), not the fast loop
@pytest.mark.slow
def test_50000_cells_within_5_percent_of_the_bound(sim):
    cluster = sim.default_cluster(1000)
    only = ["today: longest_first", "split: priors", "split: hub ids, config", "split: history"]
    results = by_policy(sim.compare(sim.synthetic_workload(50_000, cluster, seed=0), cluster, seed=0, only=only))
    table = sim.table(list(results.values()))
    assert results["today: longest_first"].ratio == pytest.approx(1.116, abs=0.001), table
    goal = {"split: priors": 1.048, "split: hub ids, config": 1.048, "split: history": 1.02}   # 1.043, 1.043, 1.015
    for name in only[1:]:
        assert results[name].ratio_split < goal[name] <= 1.05, table


@pytest.mark.parametrize("seed", range(6))
def test_small_busy_mixed_clusters(sim, seed):
    cluster = sim.default_cluster(64)
    only = ["today: longest_first", "split: priors", "split: hub ids, config", "split: history"]
    results = by_policy(sim.compare(sim.synthetic_workload(2000, cluster, seed=seed), cluster, seed=seed, only=only))
    table = sim.table(list(results.values()))
    assert results["today: longest_first"].ratio > 1.27, table
    goal = {"split: priors": 1.095, "split: hub ids, config": 1.095, "split: history": 1.08}   # worst 1.086, 1.085, 1.069
    for name in only[1:]:     # goal 1.10
        assert results[name].ratio_split < goal[name] <= 1.10, table


@pytest.mark.parametrize("gpus,cells,seed",
                         [(64, 500, 0), (64, 500, 3), (64, 2000, 1), (200, 3000, 2),
                          pytest.param(1000, 10_000, 5, marks=pytest.mark.slow)])   # the large one: full suite
def test_no_schedule_beats_the_lower_bounds(sim, gpus, cells, seed):
    cluster = sim.default_cluster(gpus)
    groups = sim.synthetic_workload(cells, cluster, seed=seed)
    placed = [g for g in groups if g.eligible]
    for r in sim.compare(groups, cluster, seed=seed):
        assert r.bound_split <= r.bound
        if r.policy.startswith("today"):     # whole groups
            assert r.makespan >= r.bound * (1 - 1e-9), r
            assert r.makespan >= max(g.duration for g in placed) - 1e-9
        assert r.makespan >= r.bound_split * (1 - 1e-9), r
        assert r.makespan >= max(g.load_s + max(g.cell_s) for g in placed) - 1e-9
        assert 0 < r.busy <= 1 + 1e-9, r


def test_the_dispatcher_sees_estimates_never_the_draws(sim):
    cluster = sim.default_cluster(64)
    groups = [g for g in sim.synthetic_workload(500, cluster, seed=2) if g.eligible]
    before = {name: plan for name, (kind, plan) in sim.policies(groups).items() if kind == "split"}
    for g in groups:                         # other true durations, the same history measurements
        g.load_s *= 3
        g.cell_s = [c * 0.5 for c in g.cell_s]
    after = {name: plan for name, (kind, plan) in sim.policies(groups).items() if kind == "split"}
    for name in SPLIT[:-1]:
        assert after[name] == before[name], name
    assert after["(oracle) split: true"] != before["(oracle) split: true"]


def test_hub_ids_are_sized_from_config_json_as_local_checkpoints_are(sim):
    cluster = sim.default_cluster(64)
    groups = [g for g in sim.synthetic_workload(300, cluster, seed=4) if g.eligible]
    with sim.hub_cache(groups):
        config = sim.estimates(groups, "config")
    local = sim.estimates(groups, "local")
    for c, l in zip(config, local):
        assert c.seconds == pytest.approx(l.seconds, rel=0.02)
    unsized = sim.estimates(groups, "unknown")
    assert max(abs(u.seconds / l.seconds - 1) for u, l in zip(unsized, local)) > 0.3


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


def test_dispatch_on_one_node_splits_the_group_that_binds(sim):
    node = [sim.NodeType("h100", 1, 8, 80, 192, ("vllm",))]
    run = Run(env_resources=True)
    long = sim.Group(0, "vllm", "m", 1 << 30, 4, 2.0, [10.0] * 4)      # 42 s whole
    short = sim.Group(1, "vllm", "m", 1 << 30, 4, 2.0, [10.0])          # 12 s
    for g in (long, short):
        sim._route(g, run, node)
    # bounds: whole groups 42 (the long one); split: the smallest T with 4 * (2 k + 40 + 12) / 8 <= T, where
    # the long group needs k = ceil(40 / (T - 2)) parts to end by T: 28 (two parts; 27 would need 28)
    assert sim.lower_bound([long, short], node) == (42.0, "longest group")
    bound, by = sim.split_lower_bound([long, short], node)
    assert bound == pytest.approx(28.0) and by == "GPU-s / GPUs, cuts' loads counted"
    truth = [(g.load_s, list(g.cell_s)) for g in (long, short)]
    makespan, used, parts = sim.simulate_dispatch([long, short], node, truth)
    # cut into two parts of 22 s (one more load), both start at 0 with the short group queued behind: 22 + 12
    assert (parts, makespan, used) == (3, 34.0, 4 * (22 + 22 + 12))
    assert sim.simulate_dispatch([long, short], node, truth, split=False, steal=False)[:2] == (42.0, 4 * 54)
    # kept whole, but at 12 s the short group's GPUs steal the long one's last unstarted cell (load 2 + 10):
    # the long one ends at 32 with three cells, the thief at 24
    assert sim.simulate_dispatch([long, short], node, truth, split=False)[:2] == (32.0, 4 * (32 + 12 + 12))


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
        assert g.weight_bytes == sim.model_size.weight_bytes("builtin:tiny")[0]
    assert 99.0 not in {d for g in groups for d in g.cell_s}   # only ok cells
    for r in sim.compare(groups, cluster):
        assert r.makespan >= r.bound_split * (1 - 1e-9)
    assert sim.main(["--gpus", "64", "--cells", "100", "--from-run", str(store.root)]) == 0
