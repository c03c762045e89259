"""`bench run` as a person sees it: the smoke matrix runs in a detached tmux session (a real terminal, so the
live display, not the plain lines), and the test reads the screen (tmux capture-pane) while it runs: the
running cell is named, the count of cells done moves between the cells of one engine group (not once per
group), and no Ray WARNING line reaches the screen (Ray's log lines go to RUN_DIR/run.log). The run is
stopped once that is seen: the rest of the smoke matrix adds nothing to what this test reads."""

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

COUNT = re.compile(r"(\d+)/(\d+) cells")
RUNNING = re.compile(r"running (\w+/[^/\s]+/[^/\s]+/[^/\s]+) b=(\d+)")
WAIT_S = 1100      # vLLM-CPU's first load alone can take minutes on a loaded 2-core machine


def tmux(socket: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["tmux", "-L", socket, *args], capture_output=True, text=True, timeout=30)


@pytest.mark.timeout(WAIT_S + 120)
def test_the_terminal_names_the_running_cell_and_counts_each_cell(tmp_path):
    socket = f"bench-test-{uuid.uuid4().hex[:8]}"     # a tmux server of its own: its environment is this one's
    run_dir = tmp_path / "run"
    env = {"PYTHONPATH": str(ROOT), "LOSSLESS_BENCH_CACHE": os.environ.get("LOSSLESS_BENCH_CACHE", ""),
           "TERM": "xterm-256color"}
    exports = "-u COLUMNS -u LINES " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if v)
    command = (f"cd {shlex.quote(str(ROOT))} && env {exports} {sys.executable} -m orchestrator.cli run matrices/smoke.yaml "
               f"--run-dir {run_dir}; echo BENCH-EXIT $?; sleep 600")
    assert tmux(socket, "new-session", "-d", "-s", "run", "-x", "160", "-y", "50", command).returncode == 0
    screens, warnings = [], []
    seen: dict[str, tuple[str, int]] = {}    # engine -> (the first of its cells seen running, the count then)
    moved = None                             # (engine, count before, count after) once the count moved inside a group
    first_engine = None
    try:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and moved is None:
            time.sleep(0.5)
            screen = tmux(socket, "capture-pane", "-p", "-t", "run").stdout
            screens.append(screen)
            warnings += [line for line in screen.splitlines() if "WARNING" in line]
            if "BENCH-EXIT" in screen:
                break
            count, running = COUNT.search(screen), RUNNING.search(screen)
            if not (count and running):
                continue
            done, engine, batch = int(count.group(1)), running.group(1), running.group(2)
            first_engine = first_engine or engine
            if engine not in seen:
                seen[engine] = (batch, done)
            elif seen[engine][0] != batch and done > seen[engine][1]:
                moved = (engine, seen[engine][1], done)   # another cell of the same group runs, one more is done
                print(f"the count moved inside the {engine} group ({seen[engine][1]} -> {done}):\n{screen}")
    finally:
        tmux(socket, "send-keys", "-t", "run", "C-c", "")
        time.sleep(3)
        final = tmux(socket, "capture-pane", "-p", "-t", "run").stdout
        tmux(socket, "kill-server")
    last = screens[-1] if screens else ""
    assert first_engine, f"no screen named a running cell; the last one read:\n{last}"
    assert moved, f"the count never moved between two cells of one engine group; the last screen:\n{last}"
    assert not warnings, f"Ray's warnings reached the terminal: {warnings[:3]}"
    assert "WARNING" not in final
    assert (run_dir / "run.log").exists(), "Ray's own log lines have a file in the run dir"
