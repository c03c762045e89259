"""The env axis without engines: expansion and ids, validation with YAML paths, the interpreter per env, env
pairs as one job, the supervisor's turn-taking (ABBA), the paired speed interval and the baseline selector
(tests/e2e/test_env_axis_run.py runs two real environments)."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest

from adapters.contract.events import TurnWait
from orchestrator.execution.runner import framework_python
from orchestrator.execution.engine_child.spec import GroupJob, pair_jobs
from orchestrator.execution.engine_child.supervisor import Floor
from orchestrator.matrix.baselines import resolve_baselines
from orchestrator.judge.speed import PAIRED, WELCH, add_speed, paired_intervals, speed_intervals, took_turns
from orchestrator.matrix.cells import expand, group
from orchestrator.matrix.validate import parse_matrix
from tests.helpers import problems

PY = sys.executable


def env_matrix(**changes) -> dict:
    data = {"models": {"tiny": "builtin:tiny"},
            "envs": {"old": {"python": PY}, "new": {"python": PY, "env_vars": {"X": "1"}}},
            "axes": {"framework": ["hf", "llamacpp"], "model": ["tiny"], "batch_size": [1, 4], "env": ["old", "new"]},
            "baseline": {"framework": "hf", "env": "old"}}
    return data | changes


def test_the_env_axis_doubles_the_cells_and_gives_each_env_its_engine():
    cells = expand(parse_matrix(env_matrix()))
    assert len(cells) == 8 and {c.env for c in cells} == {"old", "new"}
    assert len({c.cell_id for c in cells}) == 8
    groups = group(cells)
    assert len(groups) == 4 and all(len({c.env for c in g.cells}) == 1 for g in groups)


def test_ids_without_the_env_axis_stay_as_they_were():
    # tests/unit/test_workload_axis.py pins this id from before the env axis existed
    m = parse_matrix({"models": {"tiny": "builtin:tiny"},
                      "axes": {"framework": ["hf"], "model": ["tiny"], "batch_size": [1, 4], "input_len": [300]},
                      "workload": {"kind": "sharegpt", "path": "tests/data/sharegpt_multiturn.json", "multi_turn": True}})
    cells = expand(m)
    assert [c.env for c in cells] == [None, None]
    assert cells[0].cell_id == "b5c362894b9efe71" and cells[0].engine_key == "335aa07837d381b5"


def test_envs_without_the_axis_run_every_env():
    axes = env_matrix()["axes"]
    axes = {k: v for k, v in axes.items() if k != "env"}
    assert {c.env for c in expand(parse_matrix(env_matrix(axes=axes)))} == {"old", "new"}


def test_env_mistakes_are_reported_with_their_paths(tmp_path):
    got = problems(env_matrix(axes=env_matrix()["axes"] | {"env": ["old", "newer"]}))
    assert "axes.env[1]: unknown env 'newer' (defined in envs: old, new)" in got
    gone = str(tmp_path / "nowhere" / "bin" / "python")
    got = problems(env_matrix(envs={"old": {"python": gone}, "new": {"python": {"hf": PY, "vlm": PY}}}))
    assert any(p.startswith("envs.old.python: interpreter '") and "bench env old --pip" in p for p in got), got
    assert any(p.startswith("envs.new.python.vlm: unknown framework 'vlm'") for p in got), got
    assert expand(parse_matrix(env_matrix(envs={"old": {"python": gone, "cluster_only": True}, "new": {"python": PY}})))
    got = problems(env_matrix(baseline={"framework": "hf", "env": "older"}))
    assert "baseline.env: unknown env 'older' (defined in envs: old, new)" in got
    got = problems(env_matrix(envs=None))
    assert "axes.env[0]: unknown env 'old' (defined in envs: none)" in got


def test_each_env_has_its_interpreter(tmp_path, monkeypatch):
    venv = tmp_path / "venvs" / "old" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(PY)
    monkeypatch.chdir(tmp_path)
    m = parse_matrix(env_matrix(envs={"old": {"python": "venvs/old/bin/python"},
                                      "new": {"python": {"llamacpp": PY}}}))
    assert framework_python(m, "hf", "old") == str(venv / "python")   # absolute, the link itself (a venv's)
    assert framework_python(m, "llamacpp", "new") == PY
    assert framework_python(m, "hf", "new") == framework_python(m, "hf")   # not named: as without envs


def _jobs(m, groups):
    return [GroupJob(run_id="r", group=g, matrix=m, device="cpu", python=PY, cache_dir="") for g in groups]


def test_the_same_group_in_two_envs_is_one_job():
    m = parse_matrix(env_matrix())
    jobs = pair_jobs(_jobs(m, group(expand(m))))
    assert len(jobs) == 2 and all(j.twin is not None for j in jobs)
    assert [(j.group.env, j.twin.group.env) for j in jobs] == [("old", "new"), ("old", "new")]
    assert {c.cell_id for j in jobs for c in j.all_cells()} == {c.cell_id for c in expand(m)}
    three = env_matrix(envs=env_matrix()["envs"] | {"third": {"python": PY}},
                       axes=env_matrix()["axes"] | {"env": ["old", "new", "third"]})
    m3 = parse_matrix(three)
    jobs = pair_jobs(_jobs(m3, group(expand(m3))))
    assert len(jobs) == 4 and sum(j.twin is None for j in jobs) == 2   # a third env runs on its own


def _order(floor: Floor, repeats: dict[str, int], over: dict[str, int] | None = None) -> list[tuple[str, int]]:
    """Both sides ask for their next timed repeat whenever they have none running; the order granted."""
    done = {side: 0 for side in repeats}
    order = []
    while any(done[s] < repeats[s] for s in repeats):
        moved = False
        for side in ("b", "a"):   # b asks first: the floor still decides
            if done[side] < repeats[side] and floor.take(side, TurnWait(cell_id=f"{side}1", phase="timed",
                                                                       repeat=done[side])):
                order.append((side, done[side]))
                floor.release(side)
                done[side] += 1
                moved = True
                if over and done[side] == over.get(side):
                    floor.cell_over(side, f"{side}1")
        assert moved, f"deadlock after {order}"
    return order


def test_the_floor_takes_timed_repeats_abba():
    order = _order(Floor({"a1": ("k",), "b1": ("k",)}), {"a": 4, "b": 4})
    assert order == [("a", 0), ("b", 0), ("b", 1), ("a", 1), ("a", 2), ("b", 2), ("b", 3), ("a", 3)]


def test_a_side_whose_cell_ended_holds_nothing_up():
    order = _order(Floor({"a1": ("k",), "b1": ("k",)}), {"a": 1, "b": 4}, over={"a": 1})
    assert order == [("a", 0), ("b", 0), ("b", 1), ("b", 2), ("b", 3)]


def test_one_phase_at_a_time():
    floor = Floor({})
    assert floor.take("a", TurnWait(cell_id=None, phase="load"))
    assert not floor.take("b", TurnWait(cell_id=None, phase="load"))
    floor.release("b")   # not the holder: nothing happens
    assert not floor.take("b", TurnWait(cell_id="x", phase="warmup"))
    floor.release("a")
    assert floor.take("b", TurnWait(cell_id="x", phase="warmup"))


def test_turns_are_seen_in_the_repeat_times():
    assert took_turns([0, 2], [1, 3], [1, 3], [2, 4])
    assert not took_turns([0, 2], [1.5, 3], [1, 3], [2, 4])        # overlapping
    assert not took_turns([0, 2], [1, 3], [1], [2])                 # not as many
    assert not took_turns(None, None, [1, 3], [2, 4])               # not recorded


def test_the_paired_interval_drops_a_drift_both_sides_share():
    rng = np.random.default_rng(0)
    drift = np.exp(rng.normal(0, 0.3, 8))             # the host's state, repeat by repeat
    den = 100 * drift * np.exp(rng.normal(0, 0.01, 8))
    num = 110 * drift * np.exp(rng.normal(0, 0.01, 8))
    c, lo, hi, _ = paired_intervals([num], [den])
    _, wlo, whi, *_ = speed_intervals([num], [den])
    assert 1.05 < lo[0] < hi[0] < 1.15 and lo[0] < c[0] < hi[0]
    assert hi[0] / lo[0] < (whi[0] / wlo[0]) ** 0.2   # far narrower than the unpaired interval


def test_add_speed_pairs_only_env_pairs_that_took_turns():
    runs_a, runs_b = [100.0, 50.0, 100.0, 50.0], [110.0, 55.0, 110.0, 55.0]
    cells = pd.DataFrame({
        "cell_id": ["old", "new", "x"], "env": ["old", "new", None], "output_tok_s": [75.0, 82.5, 82.5],
        "output_tok_s_runs": [runs_a, runs_b, runs_b], "ttft_ms_p50": [1.0] * 3, "peak_mem_bytes": [1] * 3,
        "repeat_started_at": [[0, 2, 4, 6], [1, 3, 5, 7], [1, 3, 5, 7]],
        "repeat_ended_at": [[1, 3, 5, 7], [2, 4, 6, 8], [2, 4, 6, 8]],
        "baseline_cell_id": ["old", "old", "old"], "baseline_match": ["exact"] * 3})
    df = cells.copy()
    add_speed(df, cells, 0.05)
    assert list(df.speed_test) == [WELCH, PAIRED, WELCH]
    assert df.speedup_lo[1] == pytest.approx(1.1) and df.speedup_hi[1] == pytest.approx(1.1)   # every pair x1.1
    assert df.speed_call[1] == "faster" and df.speed_call[2] != "faster"


def test_a_baseline_env_is_the_same_configuration_in_that_env():
    m = parse_matrix(env_matrix())
    rows = pd.DataFrame([c.axes() | {"cell_id": c.cell_id} for c in expand(m)])
    chosen, how = resolve_baselines(rows, rows, {"framework": "hf", "env": "old"})
    by_id = rows.set_index("cell_id")
    for cid, base, h in zip(rows.cell_id, chosen, how):
        assert h == "exact" and by_id.env[base] == "old" and by_id.framework[base] == "hf"
        assert by_id.batch_size[base] == by_id.batch_size[cid]


def test_groups_whose_cells_mix_none_and_numbers_pair_and_pass():
    """A stream at once beside the same stream at a rate (request_rate None and 40.0 in one group): the pairing
    key sorts without comparing None to a number, with and without an env axis."""
    import sys

    from orchestrator.execution.engine_child.spec import GroupJob, pair_jobs
    from orchestrator.matrix.cells import expand, group
    from orchestrator.matrix.validate import parse_matrix

    for envs in ({}, {"envs": {"old": {"python": sys.executable}, "new": {"python": sys.executable}}}):
        m = parse_matrix({"models": {"tiny": "builtin:tiny"}, **envs,
                          "axes": {"framework": ["vllm"], "model": ["tiny"], "mode": ["stream"],
                                   "request_rate": [float("inf"), 40.0]}})
        groups = group(expand(m))
        jobs = [GroupJob(run_id="r", group=g, matrix=m, device="cpu", python=sys.executable, cache_dir="/tmp")
                for g in groups]
        paired = pair_jobs(jobs)
        assert len(paired) == (1 if envs else len(groups)) and all(len(j.group.cells) == 2 for j in paired)
        assert (paired[0].twin is not None) == bool(envs)
