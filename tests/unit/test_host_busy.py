"""The host-busy count `bench show` prints (orchestrator.report.console.host_busy_label over
adapters.contract.disturbance.disturbed_repeats): a repeat is disturbed above DISTURBED_SHARE on CPU or GPU."""

import math

from adapters.contract.disturbance import DISTURBED_SHARE, disturbed_repeats
from orchestrator.report.console import host_busy_label


def test_counts_repeats_above_the_threshold_on_either_side():
    assert disturbed_repeats([0.0, DISTURBED_SHARE + 0.01, 0.1], [0.0, 0.0, 0.9]) == (2, 3)
    assert disturbed_repeats([DISTURBED_SHARE], None) == (0, 1)   # at the threshold: not disturbed


def test_unmeasured_is_a_dash_not_zero():
    assert disturbed_repeats(None, None) is None
    assert disturbed_repeats(math.nan, None) is None
    assert host_busy_label({"host_busy_runs": None}) == "-"
    assert host_busy_label({"host_busy_runs": [0.02, 0.48, 0.3], "gpu_busy_runs": None}) == "2/3 48%"


def test_a_speed_call_over_busy_repeats_is_withheld_with_the_reason():
    import pandas as pd

    from orchestrator.judge.speed import add_speed
    from orchestrator.report.compact import speed_text

    quiet, busy = [0.01] * 6, [0.6, 0.5, 0.02, 0.7, 0.4, 0.01]
    cells = pd.DataFrame({
        "cell_id": ["base", "calm", "hit"], "output_tok_s": [100.0, 150.0, 150.0],
        "output_tok_s_runs": [[100.0, 101, 99, 100, 102, 98], [150.0, 151, 149, 150, 152, 148],
                              [150.0, 151, 149, 150, 152, 148]],
        "ttft_ms_p50": [1.0] * 3, "peak_mem_bytes": [1] * 3, "host_busy_runs": [quiet, quiet, busy],
        "gpu_busy_runs": [None] * 3, "baseline_cell_id": ["base"] * 3, "baseline_match": ["exact"] * 3})
    df = cells.copy()
    add_speed(df, cells, 0.05)
    assert df.speed_call[1] == "faster" and not isinstance(df.speed_reason[1], str)
    assert df.speed_call[2] == "cannot judge" and df.speed_reason[2] == "host busy during 4 of 6 repeats"
    assert "cannot judge (host busy during 4 of 6 repeats)" in speed_text(df.iloc[2].to_dict())
    # the baseline's busy repeats withhold every call against it; a run without the column judges as before
    cells.at[0, "host_busy_runs"] = busy
    df = cells.copy()
    add_speed(df, cells, 0.05)
    assert df.speed_reason[1] == "host busy during 4 of 6 repeats of the baseline"
    df = cells.drop(columns=["host_busy_runs", "gpu_busy_runs"])
    add_speed(df, df.copy(), 0.05)
    assert df.speed_call[1] == "faster"
