"""How a `bench run` ends: it stops the local cluster it started itself and exits at once (cli._exit_now),
with its results complete; a cluster it did not start (RAY_ADDRESS, --address) outlives it. While it runs,
the cluster it started listens on loopback alone."""

import json
import re
import subprocess
import time

import pandas as pd
import psutil

from orchestrator.execution.reaper import cluster_processes
from tests.helpers import ROOT, SMALL_MATRIX, bench_cmd


LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def _alive(p: psutil.Process) -> bool:
    """Running, and not a zombie: a killed process whose parent died waits for init to reap it."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _cmd(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline()) or p.name()
    except psutil.Error:
        return ""


def _watchdog(p: psutil.Process) -> bool:
    return "orchestrator/execution/reaper.py" in _cmd(p)


def _assert_complete(run_dir, n_cells: int) -> None:
    cells = pd.read_parquet(run_dir / "cells")
    assert len(cells) == n_cells and cells.cell_id.is_unique and set(cells.status) == {"ok"}
    compacted = json.loads((run_dir / "compacted.json").read_text())
    live = {compacted["cells"]["hf"], *compacted["logprobs"]}
    assert {str(f.relative_to(run_dir)) for f in run_dir.rglob("*.parquet")} == live, "compaction done: no per-cell files"
    assert sorted(c for f in compacted["logprobs"].values() for c in f["cells"]) == sorted(cells.cell_id)
    assert json.loads((run_dir / "manifest.json").read_text())["sessions"][-1]["ended"]


def test_a_local_run_ends_its_cluster_and_leaves_nothing_behind_with_its_results_complete(write_matrix, tmp_path,
                                                                                          tiny_model):
    path, run_dir = write_matrix(SMALL_MATRIX), tmp_path / "run"
    driver = subprocess.Popen(bench_cmd("run", str(path), "--run-dir", str(run_dir)), cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tree = psutil.Process(driver.pid)
    seen: dict[int, psutil.Process] = {}
    names: set[str] = set()
    listening: dict[tuple, str] = {}   # (address, port) -> the process listening there
    sockets_read = 0.0
    while driver.poll() is None:   # every process of the run's tree (Ray's, the engine's), as it runs
        try:
            procs = [tree, *tree.children(recursive=True)]
            for p in procs[1:]:
                seen.setdefault(p.pid, p)
                names.add(p.name())
        except psutil.Error:
            procs = []
        if time.monotonic() - sockets_read > 0.5:   # and what each listens on
            sockets_read = time.monotonic()
            for p in procs:
                try:
                    listening.update({(c.laddr.ip, c.laddr.port): p.name() for c in p.net_connections("inet")
                                      if c.status == psutil.CONN_LISTEN})
                except psutil.Error:
                    pass
        time.sleep(0.1)
    stdout, stderr = driver.communicate()
    # at once, without waiting: the run killed its cluster before it exited, not its watchdog after
    left = [(p.pid, _cmd(p)) for p in seen.values() if _alive(p) and not _watchdog(p)]
    session = re.compile(rf"/session_[^/]*_{driver.pid}/")   # its cluster's session dir (reaper.py)
    assert driver.returncode == 0, stderr[-3000:]
    assert "raylet" in names and "gcs_server" in names, f"the run started its own cluster: {names}"
    assert not left, f"outlived the run: {left}"
    # a cluster of its own is on loopback alone: the GCS, the raylet, its workers and agents, the engine
    assert {"gcs_server", "raylet"} <= set(listening.values()), f"its Ray processes' sockets were read: {listening}"
    exposed = {k: v for k, v in listening.items() if k[0] not in LOOPBACK}
    assert not exposed, f"listening beyond loopback: {exposed}"
    assert not [p for p in cluster_processes(session) if not _watchdog(p)]
    assert "verdicts (2 cells, 2 ran):" in stdout and "identical" in stdout, \
        f"the verdict summary reached stdout before the exit: {stdout}"
    _assert_complete(run_dir, 2)
    _, alive = psutil.wait_procs([p for p in seen.values() if _watchdog(p)], timeout=30)
    assert not alive, "the watchdog ends once the driver is gone"


def test_a_run_on_a_cluster_it_did_not_start_leaves_that_cluster_running(ray_local, write_matrix, tmp_path):
    address = ray_local.get_runtime_context().gcs_address
    path, run_dir = write_matrix(SMALL_MATRIX | {"axes": SMALL_MATRIX["axes"] | {"batch_size": [1]}}), tmp_path / "run"
    done = subprocess.run(bench_cmd("run", str(path), "--run-dir", str(run_dir), "--address", address), cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    _assert_complete(run_dir, 1)

    @ray_local.remote
    def ping() -> str:
        return "pong"

    assert ray_local.get(ping.remote(), timeout=60) == "pong", "the tests' cluster still runs"
    assert all(n["Alive"] for n in ray_local.nodes())
