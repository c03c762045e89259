"""(e2e: it starts busy child processes.) The per-repeat disturbance measure (adapters/contract/disturbance.py) on this host's real /proc: a busy
process in another session shows up as other processes' share of the engine cores; the engine's own
processes (this session, a child included) do not.

Each test measures from a forked child that leads its own session, as the engine child does in a run
(engine_child/supervisor.py): the session of the pytest process is whatever launched it (under CI, a whole
process tree whose own starts, exits and reaps would be counted as the engine's)."""

import os
import subprocess
import sys
import time

from adapters.contract.disturbance import Disturbance
from tests.helpers import in_own_session

BUSY = "import time\nt = time.time()\nwhile time.time() - t < {s}: pass\n"


def _spin(seconds: float) -> None:
    t = time.time()
    while time.time() - t < seconds:
        pass


@in_own_session
def test_busy_process_in_another_session_counts_as_disturbance():
    d = Disturbance()
    d.measure(lambda: _spin(0.6))
    quiet = d.cpu[-1]
    cores = len(d.cores)
    others = [subprocess.Popen([sys.executable, "-c", BUSY.format(s=3)], start_new_session=True)
              for _ in range(cores)]
    try:
        time.sleep(0.3)
        d.measure(lambda: _spin(1.0))
    finally:
        for p in others:
            p.wait()
    # every engine core had a busy loop of someone else's for the whole repeat: about half its time
    # (the engine's spin shares each core it runs on), more than a quiet repeat measured just before
    assert d.cpu[-1] > 0.3 and d.cpu[-1] > quiet, (quiet, d.cpu)
    assert d.figures()["host_busy_runs"] == d.cpu


@in_own_session
def test_the_engines_own_children_are_not_disturbance():
    d = Disturbance()
    def engine_with_child():   # the child stays in this session, as an engine's processes do
        child = subprocess.Popen([sys.executable, "-c", BUSY.format(s=1)])
        _spin(1.0)
        child.wait()
    baseline = Disturbance()
    baseline.measure(lambda: _spin(1.0))
    d.measure(engine_with_child)
    assert d.cpu[-1] < max(0.25, baseline.cpu[-1] + 0.2), (d.cpu, baseline.cpu, os.cpu_count())


@in_own_session
def test_gpu_share_is_null_with_a_reason_without_nvml():
    d = Disturbance()
    d.measure(lambda: None)
    if d.figures()["gpu_busy_runs"] is None:
        assert d.missing["gpu_busy_runs"]


@in_own_session
def test_a_repeat_too_short_for_the_clock_is_measured_over_a_window_the_clock_resolves():
    # a tiny model's batch takes a few ms; /proc/stat counts 10 ms ticks: over one repeat, one tick of anyone's
    # reads as a whole core. On a quiet moment the windowed shares stay low; with a busy loop on every core, high.
    from adapters.contract.disturbance import resolvable_s

    def three(d: Disturbance) -> float:
        began = time.time()
        for _ in range(3):
            d.measure(lambda: _spin(0.004))
        return time.time() - began

    background = Disturbance()
    background.measure(lambda: _spin(1.0))   # what the rest of the host takes now, over a second the clock resolves
    quiet = Disturbance()
    took = three(quiet)
    background.measure(lambda: _spin(1.0))   # and just after: on a shared host the rest's load moves between them
    assert took >= resolvable_s(len(quiet.cores), 1) and took < 2.0   # one untimed pause, after the first repeat
    assert len(quiet.cpu) == 3 and quiet.figures()["host_busy_runs"] == quiet.cpu
    # over one 4 ms repeat a single tick of anyone's read as a whole core (1.0); over the window, about what the
    # host's background takes
    assert max(quiet.cpu) <= max(background.cpu) + 0.3, (background.cpu, quiet.cpu)
    others = [subprocess.Popen([sys.executable, "-c", BUSY.format(s=4)], start_new_session=True)
              for _ in range(len(quiet.cores))]
    try:
        time.sleep(0.5)
        busy = Disturbance()
        three(busy)
    finally:
        for p in others:
            p.wait()
    assert min(busy.cpu) > 0.3, (quiet.cpu, busy.cpu)


@in_own_session
def test_repeats_that_take_turns_are_measured_over_their_own_span():
    """Repeats that take turns with another engine's (reach_back=False) are measured over their own span and a
    pause in their turn; alone, a repeat's window reaches back over the gap before it."""
    from adapters.contract.disturbance import resolvable_s, session_ticks

    need = resolvable_s(len(Disturbance().cores), session_ticks()[1])

    def two(reach_back: bool) -> list[float]:
        d, took = Disturbance(reach_back=reach_back), []
        for _ in range(2):
            t0 = time.monotonic()
            d.measure(lambda: None)
            took.append(time.monotonic() - t0)
            time.sleep(need)   # the gap: where the other side of a pair would run
        return took

    alone, in_turns = two(True), two(False)
    assert alone[1] < need / 2            # alone: the second repeat's window reaches back over the gap
    assert min(in_turns) >= 0.8 * need    # in turns: each repeat's own span, completed by a pause in its turn
