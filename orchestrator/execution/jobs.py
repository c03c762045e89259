"""`bench submit` / `bench status`: run a matrix on a remote Ray cluster through the Ray Jobs API.

The matrix is validated here first, then uploaded as the job's working dir; the job's entry point
is `bench run` on the head node, which is then the only writer of the results, into a path the
head can reach (a shared file system mounted on the head).
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
import time
from pathlib import Path

from orchestrator.matrix.cells import expand
from orchestrator.matrix.validate import load_matrix

TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
AGENT_WAIT_S = 120


def auth_help(err: Exception, address: str) -> str:
    """What to set, when Ray's token authentication stops a request of `bench submit` / `bench status`.

    `err` is Ray's `ray.exceptions.AuthenticationError`: the dashboard answered 401 (no token sent: the
    client's RAY_AUTH_MODE is not `token`) or 403 (a wrong token), or the client is in token mode and
    has no token at all.
    """
    reason = str(getattr(err, "message", err)).strip().split("\n")[0].split(". ")[0].rstrip(".")
    here = [f"RAY_AUTH_MODE is {os.environ.get('RAY_AUTH_MODE', 'unset')}"] + [
        f"{name} is set" for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH") if os.environ.get(name)]
    return (f"Ray's token authentication stopped the request to the cluster at {address} ({reason}). A cluster "
            "with token authentication on needs, in the client's environment, RAY_AUTH_MODE=token and the "
            "cluster's token: RAY_AUTH_TOKEN=<token>, or RAY_AUTH_TOKEN_PATH=<file> (default ~/.ray/auth_token); "
            f"`ray get-auth-token` on the head prints it. Here {', '.join(here)}.")


def _client(address: str):
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(address)


def submit(matrix_path: str | Path, address: str, run_dir: str, rerun_failed: bool = False,
           history: str | None = None) -> str:
    m, _ = load_matrix(matrix_path)   # mistakes are caught here, not on the cluster
    expand(m)
    upload = Path(tempfile.mkdtemp(prefix="bench-submit-"))
    shutil.copy(matrix_path, upload / "matrix.yaml")
    entrypoint = f"bench run matrix.yaml --run-dir {shlex.quote(run_dir)}" + (" --rerun-failed" if rerun_failed else "") \
        + (f" --history {shlex.quote(history)}" if history else "")
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
