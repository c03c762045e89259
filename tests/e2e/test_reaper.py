"""The watchdog of orchestrator/execution/reaper.py, without Ray: a stand-in driver starts it and a stand-in
cluster process whose stdout is a log file in the session dir (as Ray's are), then is SIGKILLed."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.helpers import ROOT

DRIVER = """
import os, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from orchestrator.execution import reaper
# Ray's name for a session dir ends in the pid of the process that started the cluster
session = f"{sys.argv[2]}/session_2026-01-01_00-00-00_000000_{os.getpid()}"
reaper.start()
os.makedirs(session + "/logs")
sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
# their own sessions: like Ray's agents they do not die with the driver by themselves
member = subprocess.Popen(sleep, stdout=open(session + "/logs/agent.out", "w"), start_new_session=True)
other = subprocess.Popen(sleep, stdout=subprocess.DEVNULL, start_new_session=True)
if sys.argv[3] == "yes":
    reaper.watch(session)
print(member.pid, other.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("announced", [True, False], ids=["session dir sent", "killed during ray.init"])
def test_the_watchdog_kills_the_cluster_of_a_killed_driver_and_nothing_else(tmp_path, announced):
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(ROOT), str(tmp_path), "yes" if announced else "no"],
                              stdout=subprocess.PIPE, text=True)
    member, other = (psutil.Process(int(pid)) for pid in driver.stdout.readline().split())
    try:
        time.sleep(0.5)   # the watchdog has read the session dir
        assert member.is_running() and other.is_running()
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        gone, _ = psutil.wait_procs([member], timeout=20)
        assert gone, "the cluster's process outlived the killed driver"
        assert other.is_running(), "a process outside the session dir was killed"
    finally:
        for p in (member, other):
            if p.is_running():
                p.kill()


# an engine child as the supervisor starts it (a session of its own) whose engine starts processes as vLLM
# does (multiprocessing's spawn: the engine core) and as a server would (subprocess), then gets SIGKILLed
ENGINE_CHILD = """
import multiprocessing, os, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from adapters.contract.processes import end_group_with_me
if __name__ == "__main__":
    started = end_group_with_me() if sys.argv[2] == "yes" else False
    core = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(600,))
    core.start()
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(started, core.pid, server.pid, flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("watchdog", [True, False], ids=["with its group watchdog", "without (the orphans of before)"])
def test_an_engine_childs_processes_end_with_it_however_it_ends(tmp_path, watchdog):
    script = tmp_path / "engine_child.py"
    script.write_text(ENGINE_CHILD)
    child = subprocess.Popen([sys.executable, str(script), str(ROOT), "yes" if watchdog else "no"],
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    started, *pids = child.stdout.readline().split()
    procs = [psutil.Process(int(pid)) for pid in pids]
    try:
        assert started == str(watchdog) and all(p.is_running() for p in procs)
        child.send_signal(signal.SIGKILL)   # as the OOM killer, a timeout or the death of its Ray worker would
        child.wait()
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in procs) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [p.pid for p in procs if _alive(p)]
        if watchdog:
            assert not left, "the engine's processes outlived the engine child"
        else:
            assert len(left) == 2, "without the watchdog they are orphaned: the test can see the difference"
    finally:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except OSError:
            pass


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
