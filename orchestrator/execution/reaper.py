"""A local Ray cluster that dies with its driver, however the driver ends (kill -9 included).

ray.init ties the processes it starts itself (gcs_server, raylet, the dashboard, the monitors) to
the driver with PR_SET_PDEATHSIG, but not what the raylet starts: its DashboardAgent and
RuntimeEnvAgent see the raylet die, then block reporting that to the dead GCS, and outlived a
killed `bench run`. So before it starts a local cluster the driver starts this module as a
watchdog, in its own session (a Ctrl-C in the terminal does not reach it), whose stdin is a pipe
the driver holds open. Once the cluster is up the driver writes the cluster's session dir into
the pipe. When the driver ends, for any reason, the kernel closes the pipe: the watchdog reads EOF
and SIGKILLs every process of the cluster. The cluster of a run that was killed has nothing left
to save; after a clean exit the driver has already killed it (`end()`, below) and the watchdog finds
at most stragglers.

A process of the cluster is one that has a file open in its session dir, or names the dir on its
command line: Ray sends every process's stdout and stderr to <session dir>/logs. (Not the
environment: ray::* processes overwrite theirs with their title.) A driver killed while ray.init
ran has sent no dir yet; its cluster's dir ends in its pid (session_<time>_<pid>).

Nothing depends on the old processes being gone: every `bench run` starts a fresh cluster
(address="local": its own session dir and ports).

At a normal end the CLI does not wait for Ray's graceful shutdown (a 0.5 s sleep, then SIGTERM and up
to a second of polling per process type: 1.4 s, and 1-2 s of interpreter teardown after it): once the
results are stored, `end()` SIGKILLs the cluster the driver started, waits until each of its
processes is dead, and the process exits at once (orchestrator/cli/app.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import psutil

_lifeline: list[int] = []   # the pipe's write end, which the driver keeps open until it exits
_watchdog: list[int] = []   # its pid
_sessions: list[str] = []   # the session dir of the cluster started


def start() -> None:
    """In the driver, before ray.init starts a local cluster: start the watchdog."""
    read_end, write_end = os.pipe()   # not inheritable: only the watchdog gets the read end, as its stdin
    # run as a script: it needs psutil only, not this package on the path
    dog = subprocess.Popen([sys.executable, os.path.abspath(__file__), str(os.getpid())], stdin=read_end,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    os.close(read_end)
    _lifeline[:] = [write_end]
    _watchdog[:] = [dog.pid]


def watch(session_dir: str) -> None:
    """In the driver, once the cluster is up: the watchdog kills what has files in `session_dir`."""
    if _lifeline:
        _sessions.append(os.path.abspath(session_dir))
        try:
            os.write(_lifeline[0], (os.path.abspath(session_dir) + "\n").encode())
        except OSError:   # the watchdog is gone (killed by hand): the run goes on without it
            pass


def end(timeout_s: float = 5.0) -> bool:
    """In a driver about to exit, once its results are stored: SIGKILL the local cluster it started and wait
    until each of its processes is dead. Its processes: the driver's descendants (the watchdog aside: the
    rest are Ray's and what Ray started) and whatever has files in its session dir (a worker the raylet
    forked as it was killed is no descendant any more); again until a round finds none. False, and
    nothing killed, when this process started no cluster (a RAY_ADDRESS one, the tests' own)."""
    if not _lifeline:
        return False
    pattern = _pattern(_sessions, os.getpid())
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            tree = psutil.Process().children(recursive=True)
        except psutil.Error:
            tree = []
        procs = [p for p in {p.pid: p for p in tree + cluster_processes(pattern)}.values()
                 if p.pid not in _watchdog and _alive(p)]
        if not procs:
            break
        for p in procs:
            try:
                p.kill()
            except psutil.Error:
                pass
        while any(_alive(p) for p in procs) and time.monotonic() < deadline:
            time.sleep(0.005)
    return True


def _alive(p: psutil.Process) -> bool:
    """Not gone and not a zombie. (psutil.wait_procs also waits for the reaping, which for the raylet's
    orphaned workers is up to init: about 2 s on one machine, where they died within 70 ms.)"""
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _pattern(dirs: list[str], driver_pid: int) -> re.Pattern:
    """What names a cluster's session dir: the dirs sent, else (killed during ray.init) Ray's name for it."""
    if dirs:
        return re.compile("|".join(re.escape(d.rstrip("/") + "/") for d in dirs))
    return re.compile(rf"/session_[^/]*_{driver_pid}/")


def cluster_processes(pattern: re.Pattern) -> list[psutil.Process]:
    """The processes (of this user) with a file open, or their command line, matching `pattern`."""
    out = []
    for p in psutil.process_iter():
        if p.pid == os.getpid():
            continue
        try:
            if any(pattern.search(n) for n in [f.path for f in p.open_files()] + [" ".join(p.cmdline())]):
                out.append(p)
        except (psutil.Error, OSError):   # gone meanwhile, or another user's
            continue
    return out


def kill_cluster(pattern: re.Pattern, rounds: int = 5) -> int:
    """SIGKILL every process of the cluster, again until none is left; returns how many were killed."""
    killed = 0
    for _ in range(rounds):
        procs = cluster_processes(pattern)
        if not procs:
            break
        for p in procs:
            try:
                p.kill()
                killed += 1
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=5)
    return killed


def main(driver_pid: int) -> None:
    received = b""
    while chunk := os.read(0, 4096):   # the session dir, then EOF: the driver is gone
        received += chunk
    kill_cluster(_pattern([d for d in received.decode().splitlines() if d], driver_pid))


if __name__ == "__main__":
    main(int(sys.argv[1]))
