"""`bench submit` / `bench status` against a real Ray head (with its dashboard) started on this machine."""

import copy
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

from adapters.serving.server_process import free_port
from tests.helpers import ROOT, SMALL_MATRIX, bench_cmd

TOKEN = secrets.token_hex(32)


def client_env() -> dict:
    """Ray's token authentication, as on a real cluster: head and clients share RAY_AUTH_TOKEN."""
    return os.environ | {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                         "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN}


@pytest.fixture(scope="module")
def ray_head():
    """`ray start --head --block` in its own process group: stopping it stops only this cluster.
    One for the module: starting one takes half a minute."""
    gcs, dash = free_port(), free_port()
    temp_dir = tempfile.mkdtemp(prefix="rh-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env = client_env()
    head = subprocess.Popen([str(Path(sys.executable).parent / "ray"), "start", "--head", "--block",
                             f"--port={gcs}", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
                             "--num-cpus=2", "--include-dashboard=true", f"--temp-dir={temp_dir}",
                             # its own agent ports: the default ones may be held by another cluster
                             # of this machine (the tests' local one), and then no job agent starts
                             *(f"--{name}={free_port()}" for name in (
                                 "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                 "runtime-env-agent-port", "metrics-export-port", "ray-client-server-port"))],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    address = f"http://127.0.0.1:{dash}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{address}/api/version", timeout=2)
            break
        except urllib.error.HTTPError:  # it answers (Ray's token auth says 401): it is up
            break
        except OSError:
            time.sleep(1)
    else:
        os.killpg(head.pid, signal.SIGKILL)
        pytest.fail("the Ray head's dashboard did not come up")
    yield address
    # SIGKILL, not SIGTERM: `ray start --block` spends ~30 s shutting down gracefully, and the group
    # holds every process of this cluster (checked below: none is left)
    os.killpg(head.pid, signal.SIGKILL)
    head.wait(timeout=60)
    deadline = time.monotonic() + 30
    while _cluster_processes(temp_dir) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _cluster_processes(temp_dir), _cluster_processes(temp_dir)
    shutil.rmtree(temp_dir, ignore_errors=True)


def _cluster_processes(temp_dir: str) -> list[str]:
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(temp_dir in arg for arg in p.info["cmdline"] or []):
                found.append(f"{p.info['pid']}: {' '.join(p.info['cmdline'])[:120]}")
        except psutil.Error:
            pass
    return found


def test_submit_runs_the_matrix_on_the_cluster_and_status_follows_it(ray_head, write_matrix, tmp_path, tiny_model):
    data = copy.deepcopy(SMALL_MATRIX)
    data["axes"]["batch_size"] = [1]
    run_dir = tmp_path / "shared" / "run"
    env = client_env()
    submitted = subprocess.run(bench_cmd("submit", str(write_matrix(data)), "--address", ray_head,
                                         "--run-dir", str(run_dir)),
                               cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().splitlines()[-1]
    followed = subprocess.run(bench_cmd("status", job_id, "--address", ray_head, "--follow"),
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert followed.stdout.strip().splitlines()[-1] == "SUCCEEDED", followed.stderr[-3000:]
    cells = pd.read_parquet(run_dir / "cells")
    assert list(cells.status) == ["ok"]


def test_a_client_without_the_clusters_token_is_told_what_to_set(ray_head, write_matrix, tmp_path):
    """The head has Ray's token authentication on: a client with no token, a wrong one, or token mode and
    no token anywhere gets one paragraph naming RAY_AUTH_MODE and RAY_AUTH_TOKEN and exit 2, not Ray's
    AuthenticationError traceback."""
    matrix = str(write_matrix(copy.deepcopy(SMALL_MATRIX)))
    no_auth = {k: v for k, v in client_env().items() if not k.startswith("RAY_AUTH_")}
    for env, reason in (
            (no_auth, "Authentication required: Unauthorized: Missing authentication token"),
            (no_auth | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "wrong"},
             "Authentication failed: Forbidden: Invalid authentication token"),
            (no_auth | {"RAY_AUTH_MODE": "token", "HOME": str(tmp_path)},   # no ~/.ray/auth_token either
             "Token authentication is enabled but Ray couldn't find an authentication token")):
        for args in (("submit", matrix, "--run-dir", "/tmp/never"), ("status", "raysubmit_x"),
                     ("status", "raysubmit_x", "--follow")):
            done = subprocess.run(bench_cmd(*args, "--address", ray_head), cwd=ROOT, env=env,
                                  capture_output=True, text=True, timeout=120)
            said = " ".join(done.stderr.split())
            assert done.returncode == 2, done.stderr[-3000:]
            assert "Traceback" not in done.stderr and "AuthenticationError" not in done.stderr, done.stderr[-3000:]
            assert f"stopped the request to the cluster at {ray_head} ({reason})" in said, said
            assert "RAY_AUTH_MODE=token and the cluster's token: RAY_AUTH_TOKEN=<token>, or RAY_AUTH_TOKEN_PATH" in said, said
    # with the token the same client gets past authentication: the head looks the job up (there is none)
    done = subprocess.run(bench_cmd("status", "raysubmit_x", "--address", ray_head), cwd=ROOT, env=client_env(),
                          capture_output=True, text=True, timeout=120)
    assert "Job raysubmit_x does not exist" in " ".join(done.stderr.split()), done.stderr[-3000:]
    assert "stopped the request" not in done.stderr


def test_submit_rejects_a_bad_matrix_before_contacting_the_cluster(write_matrix, tmp_path):
    data = copy.deepcopy(SMALL_MATRIX)
    data["axes"]["framework"] = ["vlm"]
    done = subprocess.run(bench_cmd("submit", str(write_matrix(data)), "--address", "http://127.0.0.1:9",
                                    "--run-dir", str(tmp_path / "run")),
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "axes.framework[0]: unknown framework 'vlm'" in done.stderr
