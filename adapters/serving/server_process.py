"""An engine's own OpenAI-compatible server as a process: `ServerProcess` starts an adapter's
`ServerLaunch` on a free loopback port, in the worker's process group and dying with the worker (so a
timeout's kill of the group takes the server and its children too), waits until its health path
answers, and stops it.

It runs inside the worker (the framework's interpreter): httpx and psutil only, imported lazily.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

from adapters.contract.openai_api import ServerLaunch
from adapters.contract.processes import die_with_parent


class ServerError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """One server child on 127.0.0.1:port. Its output goes to `log_path`."""

    def __init__(self, launch: ServerLaunch, port: int, log_path: str, startup_timeout_s: float = 600.0,
                 health_path: str = "/v1/models"):
        self.launch, self.port, self.log_path = launch, port, log_path
        self.startup_timeout_s, self.health_path = startup_timeout_s, health_path
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, chars: int = 3000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log_path) - chars))
                return f.read().decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def exit_description(self) -> str | None:
        code = self.proc.poll() if self.proc else None
        if code is None:
            return None
        return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"

    def start(self) -> "ServerProcess":
        import httpx

        log = open(self.log_path, "ab")
        # same process group as the worker (no new session): killing the worker's group kills the server
        self.proc = subprocess.Popen(self.launch.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=os.environ | self.launch.env, preexec_fn=die_with_parent)
        log.close()
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            how = self.exit_description()
            if how:
                raise ServerError(f"the server {how} before it answered GET {self.health_path}; "
                                  f"its last output:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + self.health_path, timeout=2.0, trust_env=False).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise ServerError(f"the server did not answer GET {self.health_path} within "
                                  f"{self.startup_timeout_s:g}s; its last output:\n{tail}")
            time.sleep(0.25)

    def pids(self) -> list[int]:
        return [self.proc.pid] if self.proc else []

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM to the server and its children, SIGKILL to whatever is left after the grace period."""
        import psutil

        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            procs = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.Error:
            procs = []
        for p in procs:
            try:
                p.terminate()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=grace_s)
        self.proc.poll()
