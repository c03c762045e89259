"""Faults end as rows, never as the end of the run: a segfault, a hang, a killed driver.

The engine is the real transformers adapter in a real child process. The fault is injected by a
per-framework interpreter (the matrix's `run.python`): a wrapper that starts the same Python with
a sitecustomize which makes generate() segfault or hang for one batch size. Everything else (the
launcher, the process group, the timeout, the restart for the remaining cells) is the real code.
"""

import copy
import signal
import subprocess
import sys
import time

import pandas as pd
import psutil
import pytest

from orchestrator.execution.runner import run_matrix
from orchestrator.store.run_store import RunStore
from tests.helpers import ROOT, SMALL_MATRIX, bench_cmd

SITECUSTOMIZE = """
import ctypes, os, time
kind, batch = os.environ["BENCH_TEST_FAULT"].split(":")
import adapters.engines.hf as hf
original = hf.HfAdapter.generate
def generate(self, prompts, output_len, ignore_eos):
    if len(prompts) == int(batch):
        if kind == "segv":
            # an engine's own process, as vLLM's engine core is: it must end with the crashed engine child
            import subprocess, sys
            core = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(600)", "VLLM::EngineCore (stand-in)"])
            with open(os.environ["BENCH_TEST_CORE_PIDS"], "a") as f:
                f.write(f"{core.pid}\\n")
            ctypes.string_at(0)  # a real SIGSEGV: read address 0
        time.sleep(3600)
    return original(self, prompts, output_len, ignore_eos)
hf.HfAdapter.generate = generate
"""


def faulty_python(tmp_path, fault: str) -> str:
    site = tmp_path / "fault_site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    wrapper = tmp_path / "python-with-fault"
    wrapper.write_text(f'#!/bin/sh\nexport PYTHONPATH="{site}:$PYTHONPATH"\n'
                       f'export BENCH_TEST_FAULT="{fault}"\nexport BENCH_TEST_CORE_PIDS="{tmp_path}/core_pids"\n'
                       f'exec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def matrix_with_fault(tmp_path, fault: str, **run) -> dict:
    data = copy.deepcopy(SMALL_MATRIX)
    data["axes"]["batch_size"] = [1, 2, 3]
    data["run"] |= {"python": {"hf": faulty_python(tmp_path, fault)}} | run
    return data


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_segfault_becomes_a_crashed_row_and_the_other_cells_finish(ray_local, write_matrix, tmp_path):
    store = run_matrix(write_matrix(matrix_with_fault(tmp_path, "segv:2")), tmp_path / "run")
    cells = store.read_cells().set_index("batch_size")
    assert cells.loc[1, "status"] == "ok" and cells.loc[3, "status"] == "ok"
    assert cells.loc[2, "status"] == "crashed"
    assert "killed by SIGSEGV while running this cell" in cells.loc[2, "reason"]
    cores = [psutil.Process(int(pid)) for pid in (tmp_path / "core_pids").read_text().split()]
    assert cores, "the crashing engine started its own process"
    assert not [p.pid for p in cores if _running(p)], "the engine's own process outlived its crashed engine child"
    assert cells.loc[3, "attempt"] == 2  # a fresh engine process ran the cell after the crash


def test_hang_past_the_cell_timeout_becomes_a_timeout_row(ray_local, write_matrix, tmp_path):
    data = matrix_with_fault(tmp_path, "hang:2", cell_timeout_s=20)
    started = time.monotonic()
    store = run_matrix(write_matrix(data), tmp_path / "run")
    cells = store.read_cells().set_index("batch_size")
    assert cells.loc[2, "status"] == "timeout"
    assert "killed after the cell timeout 20s" in cells.loc[2, "reason"]
    assert cells.loc[1, "status"] == "ok" and cells.loc[3, "status"] == "ok"
    assert time.monotonic() - started < 300


def _cell_files(run_dir):
    # the cells stored so far (a record the kill tore is not a stored cell: readers skip it)
    try:
        return sorted(RunStore(run_dir).stored_status())
    except FileNotFoundError:   # a journal file created or removed while it was being listed
        return []


def _name(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline()[:3]) or p.name()
    except psutil.Error:
        return ""


def _engine_running(driver) -> bool:
    try:
        return any("adapters.worker" in " ".join(p.cmdline()) for p in driver.children(recursive=True))
    except psutil.Error:
        return False


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill -9", "SIGTERM"])
def test_killed_driver_leaves_no_process_behind_and_resumes_with_every_cell_stored_once(sig, write_matrix, tmp_path):
    """kill -9: nothing runs in the driver; SIGTERM stops it as Ctrl-C does: exit 143 and one line, no traceback
    and no crash dump of Ray's (orchestrator/execution/stop.py). Either way nothing outlives it and a resume
    stores every cell once."""
    data = copy.deepcopy(SMALL_MATRIX)
    data["axes"]["batch_size"] = [1, 2, 3]
    data["axes"]["flags"] = ["default", "eager"]
    data["flags"] = {"hf": {"eager": {"attn_implementation": "eager"}}}
    path, run_dir = write_matrix(data), tmp_path / "run"
    driver = subprocess.Popen(bench_cmd("run", str(path), "--run-dir", str(run_dir)), cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    tree = psutil.Process(driver.pid)
    deadline = time.monotonic() + 600
    while not (_cell_files(run_dir) and _engine_running(tree)) and time.monotonic() < deadline and driver.poll() is None:
        time.sleep(0.2)
    # the run's processes, mid-group: Ray's (gcs_server, raylet, its agents and workers) and the engine's
    procs = tree.children(recursive=True)
    names = " ".join(_name(p) for p in procs)
    driver.send_signal(sig)
    _, stderr = driver.communicate(timeout=120)
    if sig == signal.SIGTERM:
        last = [x for x in stderr.splitlines() if x.strip()][-1]
        assert driver.returncode == 143 and last.startswith("bench: stopped by SIGTERM"), stderr[-3000:]
        assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]
    stored_before_kill = len(_cell_files(run_dir))
    assert 1 <= stored_before_kill < 6, "the kill must land mid-run"
    assert "raylet" in names and "adapters.worker" in names, names

    _, alive = psutil.wait_procs(procs, timeout=20)   # is_running() checks the start time too: no reused pid
    try:
        assert not alive, f"outlived the killed driver: {[(p.pid, _name(p)) for p in alive]}"
    finally:
        for p in alive:
            p.kill()

    done = subprocess.run(bench_cmd("run", str(path), "--run-dir", str(run_dir)), cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{stored_before_kill} of 6 cells already stored" in " ".join(done.stderr.split())
    assert not list(run_dir.rglob(".tmp-*")), "partial writes are removed on resume"
    cells = pd.read_parquet(run_dir / "cells")
    assert len(cells) == 6 and cells.cell_id.is_unique and set(cells.status) == {"ok"}
    lp = pd.read_parquet(run_dir / "logprobs")
    assert not lp.duplicated(["cell_id", "kind", "repeat", "prompt_index", "position"]).any()
    assert lp.groupby("cell_id").size().nunique() == 1  # every cell has the full set of rows


def test_a_crash_in_the_drift_check_is_the_moved_cell_s_row(ray_local, write_matrix, tmp_path):
    """The group's first cell (batch 1) is timed right after the load for the drift check
    (adapters.worker.group.drift_order): a segfault there is that cell's crashed row, the others finish."""
    store = run_matrix(write_matrix(matrix_with_fault(tmp_path, "segv:1")), tmp_path / "run")
    cells = store.read_cells().set_index("batch_size")
    assert cells.loc[1, "status"] == "crashed" and "SIGSEGV" in cells.loc[1, "reason"]
    assert cells.loc[2, "status"] == "ok" and cells.loc[3, "status"] == "ok"
