"""Drift inside one run (orchestrator/judge/speed.py run_drift): cells whose timed batch was measured twice
in the run widen every Welch speed interval by the pooled drift between their two measurements (run_noise,
the estimate that widens intervals across runs); a paired interval stays as it was."""

import math

import numpy as np
import pandas as pd

from adapters.contract.intervals import log_ratio_intervals, run_noise
from orchestrator.judge.speed import WELCH, add_speed, run_drift


def tight(m: float) -> list[float]:
    return [m * f for f in (1.0, 1.01, 0.99, 1.0, 1.02, 0.98)]


def _cells(recheck: list | None) -> pd.DataFrame:
    cells = pd.DataFrame({
        "cell_id": ["base", "b2", "b3", "fast"], "output_tok_s": [100.0, 100.0, 100.0, 115.0],
        "output_tok_s_runs": [tight(100.0), tight(100.0), tight(100.0), tight(115.0)],
        "ttft_ms_p50": [1.0] * 4, "peak_mem_bytes": [1] * 4,
        "baseline_cell_id": ["base"] * 4, "baseline_match": ["exact"] * 4})
    if recheck is not None:
        cells["output_tok_s_recheck_runs"] = recheck
    return cells


def test_a_run_without_rechecks_judges_from_the_repeats_alone():
    df = _cells(None)
    add_speed(df, df.copy(), 0.05)
    assert df.speed_call[3] == "faster" and df.speed_test[3] == WELCH
    assert math.isnan(df.speed_drift_sd[3]) and df.speed_drift[3] is None
    assert run_drift(df) == (0.0, math.inf, None)


def test_drift_between_a_batch_s_two_measurements_widens_the_intervals():
    moved = [[80.0, 81, 79, 80, 82, 78], [125.0, 126, 124, 125, 127, 123], [70.0, 71, 69, 70, 72, 68], None]
    df = _cells(moved)
    before = _cells(None)
    add_speed(before, before.copy(), 0.05)
    add_speed(df, df.copy(), 0.05)
    var, dof, source = run_drift(df)
    assert dof == 3 and source == "3 cell(s) measured twice in this run"
    # one definition: the pooled variance is run_noise's, and the interval is log_ratio_intervals' with it
    assert var == run_noise(list(df.output_tok_s_runs[:3]), moved[:3])[0] > 0.01
    _, lo, hi = log_ratio_intervals(np.array([df.output_tok_s_runs[3]]), np.array([df.output_tok_s_runs[0]]),
                                    0.95, var, dof)
    assert (df.speedup_lo[3], df.speedup_hi[3]) == (lo[0], hi[0])
    assert df.speedup_hi[3] - df.speedup_lo[3] > 5 * (before.speedup_hi[3] - before.speedup_lo[3])
    assert df.speed_call[3] != "faster" and before.speed_call[3] == "faster"   # 1.15x inside a 20% drift
    assert df.speed_drift_sd[3] == math.sqrt(var) and df.speed_drift[3] == source


def test_a_steady_recheck_leaves_a_real_difference_called():
    steady = [[100.0, 101, 99, 100, 101, 99], [100.5, 99, 101, 100, 102, 98], [99.5, 100, 99, 101, 100, 100], None]
    df = _cells(steady)
    add_speed(df, df.copy(), 0.05)
    assert df.speed_call[3] == "faster" and df.speed_drift_sd[3] < 0.01
