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
