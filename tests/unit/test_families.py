"""The family of a layer's tests (orchestrator/judge/families.py): q values as scipy's BH / BY give them, the level a
test not called had to beat, and the task layer deciding by q: the smoke run's `improved` at p = 0.047, one of 33
task tests (3 tasks x 11 cells), is no call at the family level. (The null study: benchmarks/task_null.py.)"""

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binomtest, false_discovery_control

from orchestrator.judge.families import BH, BY, family
from orchestrator.judge.task_verdicts import task_verdicts
from orchestrator.matrix.models import AXES


def test_q_values_and_the_level_by_hand():
    p = [0.001, 0.008, 0.039, 0.041, 0.042, 0.06, 0.074, 0.205, None, float("nan")]
    fam = family(p, 0.05, BH)
    have = np.array([x for x in p[:8]])
    assert np.allclose(fam.q[:8], false_discovery_control(have, method="bh"))
    assert np.isnan(fam.q[8:]).all() and not fam.called[8:].any()   # a test that did not run is no member
    # BH by hand: p_(k) <= k/8 x 0.05: k=2 (0.008 <= 0.0125) is the largest: two calls
    assert fam.size == 8 and fam.n_called == 2 and list(fam.called[:8]) == [True, True] + [False] * 6
    # a test not called had to beat alpha x (R + 1) / m
    assert fam.level == pytest.approx(0.05 * 3 / 8)
    by = family(p, 0.05, BY)
    assert np.allclose(by.q[:8], false_discovery_control(have, method="by"))
    assert (by.q[:8] >= fam.q[:8] - 1e-15).all() and by.n_called <= fam.n_called
    harmonic = sum(1 / k for k in range(1, 9))
    assert by.level == pytest.approx(min(0.05, 0.05 * (by.n_called + 1) / 8 / harmonic))
    # a family of one is the test itself
    one = family([0.047], 0.05)
    assert one.q[0] == pytest.approx(0.047) and one.called[0] and one.level == 0.05
    with pytest.raises(ValueError, match="unknown correction"):
        family([0.1], 0.05, "holm")


def _cells(n: int) -> pd.DataFrame:
    return pd.DataFrame([{**{a: None for a in AXES}, "cell_id": f"c{i:02d}", "framework": "llamacpp", "model": "tiny",
                          "quantization": "q8_0" if i == 1 else "fp32", "flags": f"f{i:02d}", "batch_size": 1,
                          "mode": "offline", "status": "ok", "missing": None, "baseline_cell_id": "c00",
                          "baseline_match": "exact", "base_key": None} for i in range(n)])


def _items(cell: str, task: str, scores) -> pd.DataFrame:
    return pd.DataFrame({"cell_id": cell, "task": task, "metric": "acc", "item_index": range(len(scores)),
                         "score": np.asarray(scores, float), "score_weight": np.nan, "aggregation": "mean",
                         "higher_is_better": True})


def test_the_smoke_runs_improved_at_p_0047_is_decided_by_its_q():
    # 12 cells (the baseline and 11 others) x 3 tasks: 33 tests. q8_0's tiny-continue: 15 items better, 5 worse
    # of 200, McNemar p = 0.041; every other cell moves items both ways alike.
    base = np.tile([1.0, 0.0], 100)
    rows = []
    for i in range(12):
        for task in ("tiny-continue", "tiny-ending", "tiny-lastword"):
            s = base.copy()
            if i == 1 and task == "tiny-continue":
                s[1:31:2] = 1.0                 # 15 wrong items right
                s[0:10:2] = 0.0                 # 5 right items wrong
            elif i:
                s[1:7:2], s[0:6:2] = 1.0, 0.0   # 3 each way
            rows.append(_items(f"c{i:02d}", task, s))
    items = pd.concat(rows, ignore_index=True)
    tv = task_verdicts(_cells(12), items, items, 0.05)
    q8 = tv[(tv.quantization == "q8_0") & (tv.task == "tiny-continue")].iloc[0]
    p = binomtest(15, 20, 0.5).pvalue
    assert q8.p_value == pytest.approx(p) and p < 0.05         # per test: `improved`
    tested = tv[tv.cell_id != "c00"]                            # the baseline against itself is no test
    assert len(tested) == 33 and (tested.family_size == 33).all()
    others = tested.p_value.drop(q8.name).to_numpy()
    assert q8.q_value == pytest.approx(false_discovery_control(np.r_[p, others], method="bh")[0])
    assert q8.q_value > 0.05 and q8.task_verdict in ("no change", "not distinguishable")
    assert f"p={p:.3g} q={q8.q_value:.3g}" in q8.task_reason and "0 of 33 tests called at FDR 0.05" in q8.task_reason
    # its power is stated at the family's level (0.05 / 33), not at 0.05: a larger smallest-visible change
    alone = task_verdicts(_cells(2), items[items.cell_id.isin(["c00", "c01"]) & (items.task == "tiny-continue")],
                          items, 0.05)
    one = alone[alone.cell_id == "c01"].iloc[0]
    assert one.task_verdict == "improved" and one.q_value == pytest.approx(p)   # a family of one: as before
    assert q8.family_level == pytest.approx(0.05 / 33) and q8.mde > one.mde
    # a change the family still calls: 60 of 200 items right where the baseline had them wrong
    strong = items.copy()
    pick = (strong.cell_id == "c01") & (strong.task == "tiny-continue")
    s = base.copy()
    s[1:121:2] = 1.0
    strong.loc[pick, "score"] = s
    tv2 = task_verdicts(_cells(12), strong, strong, 0.05)
    row = tv2[(tv2.quantization == "q8_0") & (tv2.task == "tiny-continue")].iloc[0]
    assert row.q_value < 0.05 and row.task_verdict == "improved"


def test_judge_run_says_what_each_family_held_and_bench_gate_prints_it(tmp_path):
    import shutil

    from typer.testing import CliRunner

    from orchestrator.cli import app
    from orchestrator.judge.verdicts import judge_run
    from tests.helpers import ROOT

    run = ROOT / "tests" / "data" / "golden" / "runs" / "new"
    v = judge_run(run)
    # 4 cells x 2 tasks, the baseline against itself left out; 3 ok cells with a speed-up test; 3 sampled cells
    assert v.family_lines()[0] == "tasks: 0 of 6 tests called at FDR 0.05 (Benjamini-Hochberg)"
    assert (v.tasks[v.tasks.cell_id != v.tasks.baseline_cell_id].family_size == 6).all()
    assert v.family_lines()[1].startswith("speed: ") and v.family_lines()[2].startswith("sampling: ")
    assert v.cells.speed_q.notna().any() and v.sampling.sampling_q.notna().any()
    shutil.copytree(run, tmp_path / "new")
    policy = tmp_path / "policy.yaml"
    policy.write_text("rules:\n  - match: {framework: llamacpp}\n"
                      "    task: {name: tiny-ending, no_regression: true, accept_underpowered: true}\n")
    res = CliRunner().invoke(app, ["gate", str(tmp_path / "new"), "--policy", str(policy)], catch_exceptions=False)
    assert "family: tasks: 0 of 6 tests called at FDR 0.05" in res.stdout, res.stdout


def test_a_gates_many_speed_bounds_hold_the_familys_level():
    """bench gate's max_slowdown is judged by the interval at the speed family's level (speed.family_calls' band),
    so bounding 20 cells does not fail one by chance where a single bound would: a 12% drop whose 95% interval is
    wholly below x0.95 fails alone, and passes 'within the noise' among 19 cells that changed nothing."""
    from orchestrator.judge.gate import Policy, gate
    from orchestrator.judge.speed import family_calls, speed_intervals, speed_p

    rng = np.random.default_rng(3)
    old = [100 * np.exp(rng.normal(0, 0.04, 6)) for _ in range(20)]
    new = [100 * np.exp(rng.normal(0, 0.04, 6)) for _ in range(20)]
    new[0] = old[0].mean() * 0.88 * np.exp(rng.normal(0, 0.04, 6))

    def rows(k: int) -> pd.DataFrame:
        num, den = new[:k], old[:k]
        center, lo, hi, n_new, n_old = speed_intervals(num, den)
        p = speed_p(num, den)
        q, calls, band_lo, band_hi = family_calls(num, den, center, lo, hi, p, np.zeros(k, bool), 0.05)
        return pd.DataFrame({
            "cell_id": [f"c{i}" for i in range(k)], "framework": "hf", "model": "tiny", "quantization": "fp32",
            "flags": [f"f{i}" for i in range(k)], "mode": "offline", "batch_size": 1, "request_rate": None,
            "load": None, "verdict": "identical", "verdict_reason": "", "only_in": None, "run_noise": "1 run",
            "tok_s_ratio": center, "tok_s_lo": lo, "tok_s_hi": hi, "tok_s_band_lo": band_lo, "tok_s_band_hi": band_hi,
            "tok_s_n": "6/6", "tok_s_run_sd": np.nan})

    policy = Policy.model_validate({"rules": [{"match": {"framework": "hf"}, "max_slowdown": 0.05}]})
    alone, many = rows(1), rows(20)
    assert alone.tok_s_hi[0] < 0.95 and many.tok_s_hi[0] < 0.95   # the same 95% interval either way
    passed, lines = gate(alone, policy, against=True)
    assert not passed and "wholly below x0.950" in lines[0], lines
    passed, lines = gate(many, policy, against=True)
    assert passed and many.tok_s_band_hi[0] >= 0.95, (lines, many.tok_s_band_hi[0])
    # the family still calls it slower (q < 0.05): a drop, not one beyond the bound at the family's level
    assert many.tok_s_band_hi[0] < 1.0
