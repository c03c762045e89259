"""`bench submit` / `bench status`: run a matrix on a remote Ray cluster through the Ray Jobs API.

The matrix is validated here first, then uploaded as the job's working dir; the job's entry point
is `bench run` on the head node, which is then the only writer of the results, into a path the
head can reach (a shared file system mounted on the head).
"""

from __future__ import annotations

import shlex
import shutil
import tempfile
import time
from pathlib import Path

from orchestrator.cells import expand
from orchestrator.matrix import load_matrix

TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
AGENT_WAIT_S = 120


def _client(address: str):
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(address)


def submit(matrix_path: str | Path, address: str, run_dir: str, rerun_failed: bool = False) -> str:
    m, _ = load_matrix(matrix_path)   # mistakes are caught here, not on the cluster
    expand(m)
    upload = Path(tempfile.mkdtemp(prefix="bench-submit-"))
    shutil.copy(matrix_path, upload / "matrix.yaml")
    entrypoint = f"bench run matrix.yaml --run-dir {shlex.quote(run_dir)}" + (" --rerun-failed" if rerun_failed else "")
    try:
        client = _client(address)
        deadline = time.monotonic() + AGENT_WAIT_S
        while True:
            try:
                return client.submit_job(entrypoint=entrypoint, runtime_env={"working_dir": str(upload)},
                                         metadata={"matrix": m.name})
            except RuntimeError as err:
                # a head that has just started answers before its job agent is up: wait for it
                if "No available agent" not in str(err) or time.monotonic() > deadline:
                    raise
                time.sleep(2)
    finally:
        shutil.rmtree(upload, ignore_errors=True)


def status(job_id: str, address: str) -> tuple[str, str]:
    client = _client(address)
    return str(client.get_job_status(job_id).value), client.get_job_logs(job_id)


def follow(job_id: str, address: str, poll_s: float = 2.0, timeout_s: float | None = None, echo=print) -> str:
    """Print the job's new log lines until it ends; returns its final status."""
    client, shown = _client(address), 0
    end = time.monotonic() + timeout_s if timeout_s else None
    while True:
        state = str(client.get_job_status(job_id).value)
        logs = client.get_job_logs(job_id)
        if len(logs) > shown:
            echo(logs[shown:].rstrip("\n"))
            shown = len(logs)
        if state in TERMINAL or (end and time.monotonic() > end):
            return state
        time.sleep(poll_s)
