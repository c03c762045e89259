"""measure.paired_timing: which groups get their baseline's engine beside them as a timing twin, the ABBA turns
of a cell and its baseline cell, the paired arithmetic on the base_* repeats a cell's row carries, and when a
busy host still leaves a paired call `cannot judge`."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest

from adapters.contract.disturbance import split_pairs
from orchestrator.execution.engine_child.spec import GroupJob, pair_jobs, timing_partners, timing_twins
from orchestrator.judge.speed import PAIRED, WELCH, add_speed, host_busy_reason, paired_intervals
from orchestrator.matrix.cells import expand, group
from orchestrator.matrix.validate import parse_matrix

PY = sys.executable


def _matrix(**measure) -> dict:
    return {"models": {"tiny": "builtin:tiny"},
            "axes": {"framework": ["hf", "llamacpp"], "model": ["tiny"], "batch_size": [1, 4]},
            "baseline": {"framework": "hf", "quantization": "fp32", "flags": "default"},
            "measure": measure}


def _jobs(data: dict, device: str = "cpu") -> list[GroupJob]:
    m = parse_matrix(data)
    return timing_twins(pair_jobs([GroupJob(run_id="r", group=g, matrix=m, device=device, python=PY, cache_dir="")
                                   for g in group(expand(m))]))


def test_a_group_gets_its_baselines_engine_as_a_timing_twin():
    jobs = {j.group.framework: j for j in _jobs(_matrix(paired_timing=True))}
    hf, cpp = jobs["hf"], jobs["llamacpp"]
    assert hf.timing_twin is None and not hf.timing_pairs   # the baseline's own group: nothing to pair with
    twin = cpp.timing_twin
    assert twin is not None and twin.timing_only and twin.group.framework == "hf"
    by_batch = {c.batch_size: c.cell_id for c in hf.group.cells}
    assert cpp.timing_pairs == {c.cell_id: by_batch[c.batch_size] for c in cpp.group.cells}   # same batch, exact
    assert [c.cell_id for c in twin.group.cells] == [cpp.timing_pairs[c.cell_id] for c in cpp.group.cells]


def test_paired_timing_off_or_on_a_gpu_leaves_the_jobs_as_they_were():
    assert all(j.timing_twin is None for j in _jobs(_matrix(paired_timing=False)))
    assert all(j.timing_twin is None for j in _jobs(_matrix(), device="cuda"))          # null: off on a GPU
    assert all(j.timing_twin is None for j in _jobs(_matrix()))                         # and on a CPU (spin-waits)
    assert any(j.timing_twin is not None for j in _jobs(_matrix(paired_timing=True), device="cuda"))


def test_a_baseline_cell_is_paired_once_per_group():
    data = _matrix(paired_timing=True) | {"baseline": {"framework": "hf", "flags": "default", "batch_size": 1}}
    cpp = next(j for j in _jobs(data) if j.group.framework == "llamacpp")
    assert len(cpp.timing_pairs) == 1 and len(cpp.timing_twin.group.cells) == 1   # the other cell: Welch


def test_a_baseline_in_the_cells_own_engine_load_takes_turns_inside_it():
    """A selector that fixes batch_size judges hf batch 4 against hf batch 1, one engine load: the engine child times
    batch 1 beside batch 4's repeats unless paired_timing is false (no twin needed, so null is on)."""
    data = _matrix() | {"baseline": {"framework": "hf", "flags": "default", "batch_size": 1}}
    for measure, on in (({}, True), ({"paired_timing": True}, True), ({"paired_timing": False}, False)):
        m = parse_matrix(data | {"measure": measure})
        groups = {g.framework: g for g in group(expand(m))}
        hf, cpp = groups["hf"].cells, groups["llamacpp"].cells
        b1 = next(c.cell_id for c in hf if c.batch_size == 1)
        b4 = next(c.cell_id for c in hf if c.batch_size == 4)
        assert timing_partners(m, hf) == ({b4: b1} if on else {})
        assert timing_partners(m, cpp) == {}   # their baseline is hf's: another engine load (a twin's, if any)
    m = parse_matrix(_matrix())   # the selector leaves batch_size to the cell: every baseline is itself or elsewhere
    assert all(timing_partners(m, g.cells) == {} for g in group(expand(m)))


def _cells(base_runs, cell_runs, base_twin_runs, turns=True) -> pd.DataFrame:
    a_start, a_end = [0.0, 3.0, 4.0, 7.0], [1.0, 4.0, 5.0, 8.0]           # a0 b0 b1 a1 a2 b2 b3 a3
    b_start, b_end = [1.0, 2.0, 5.0, 6.0], [2.0, 3.0, 6.0, 7.0]
    if not turns:
        b_start = [0.5, 2.0, 5.0, 6.0]
    return pd.DataFrame({
        "cell_id": ["base", "cell"], "output_tok_s": [np.mean(base_runs), np.mean(cell_runs)],
        "output_tok_s_runs": [base_runs, cell_runs], "ttft_ms_p50": [1.0, 1.0], "peak_mem_bytes": [1, 1],
        "repeat_started_at": [[10.0, 11, 12, 13], a_start], "repeat_ended_at": [[10.5, 11.5, 12.5, 13.5], a_end],
        "base_timing_cell": [None, "base"], "base_output_tok_s_runs": [None, base_twin_runs],
        "base_repeat_started_at": [None, b_start], "base_repeat_ended_at": [None, b_end],
        "base_host_busy_runs": [None, [0.0] * 4], "host_busy_runs": [[0.0] * 4] * 2,
        "baseline_cell_id": ["base", "base"], "baseline_match": ["exact"] * 2})


def test_the_cell_is_judged_paired_against_the_twins_repeats():
    drift = np.array([1.0, 0.5, 1.0, 0.5])          # the host halves everything in turns
    cells = _cells([200.0, 200.0, 200.0, 200.0], list(110 * drift), list(100 * drift))
    df = cells.copy()
    add_speed(df, cells, 0.05)
    assert list(df.speed_test) == [WELCH, PAIRED]
    # against the twin's repeats, pair by pair: x1.1 exactly; against the baseline's own row it would be ~0.41x
    assert df.speedup_lo[1] == pytest.approx(1.1) and df.speedup_hi[1] == pytest.approx(1.1)
    assert df.speed_call[1] == "faster" and df.speedup_n_base[1] == 4


def test_repeats_that_overlapped_fall_back_to_welch():
    drift = np.array([1.0, 0.5, 1.0, 0.5])
    cells = _cells([200.0] * 4, list(110 * drift), list(100 * drift), turns=False)
    df = cells.copy()
    add_speed(df, cells, 0.05)
    assert df.speed_test[1] == WELCH and df.speedup[1] < 1   # against the baseline's own row (~0.41x), widened
    assert df.speed_drift[1] == "1 cell(s) measured twice in this run"   # by the baseline's two timings' drift


def test_the_paired_ratio_is_the_mean_log_ratio():
    num, den = np.array([110.0, 60.0, 90.0]), np.array([100.0, 50.0, 100.0])
    c, lo, hi, p = paired_intervals([num], [den])
    logs = np.log(num / den)
    assert c[0] == pytest.approx(np.exp(logs.mean()))
    from scipy import stats

    half = stats.t.ppf(0.975, 2) * logs.std(ddof=1) / np.sqrt(3)
    assert (lo[0], hi[0]) == pytest.approx((np.exp(logs.mean() - half), np.exp(logs.mean() + half)))
    assert p[0] == pytest.approx(stats.ttest_1samp(logs, 0).pvalue)


def test_a_load_on_both_sides_of_each_pair_is_no_reason_to_withhold():
    busy, quiet = [0.6, 0.6, 0.0, 0.0, 0.6, 0.6], [0.0] * 6
    assert split_pairs(busy, None, busy, None) == (0, 6)
    assert host_busy_reason(busy, None, busy, None, paired=True) is None
    assert host_busy_reason(busy, None, busy, None) == ("host busy during 4 of 6 repeats; "
                                                        "host busy during 4 of 6 repeats of the baseline")   # Welch
    assert split_pairs(busy, None, quiet, None) == (4, 6)
    assert host_busy_reason(busy, None, quiet, None, paired=True).startswith("host load split 4 of 6 pairs")
    one = [0.6] + [0.0] * 5
    assert host_busy_reason(one, None, quiet, None, paired=True) is None   # 1 of 6 split: within MAX_DISTURBED
    assert split_pairs(busy, None, [0.0], None) is None


def test_a_baseline_timed_again_by_a_twin_counts_in_the_runs_drift():
    from orchestrator.judge.speed import run_drift

    cells = pd.DataFrame({"cell_id": ["base", "cell"], "output_tok_s_runs": [[100.0, 101.0, 99.0], [50.0, 51.0, 49.0]],
                          "output_tok_s_recheck_runs": [None, None],
                          "base_timing_cell": [None, "base"], "base_output_tok_s_runs": [None, [80.0, 81.0, 79.0]]})
    var, dof, source = run_drift(cells)
    assert source == "1 cell(s) measured twice in this run" and dof == 1
    assert var == pytest.approx(np.log(80 / 100) ** 2, rel=0.05)   # the host moved ~20% between the two timings
    assert run_drift(cells.assign(base_timing_cell=[None, None]))[2] is None
