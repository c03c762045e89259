"""The watchdog of orchestrator/execution/reaper.py, without Ray: a stand-in driver starts it and a stand-in
cluster process whose stdout is a log file in the session dir (as Ray's are), then is SIGKILLed."""

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
