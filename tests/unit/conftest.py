"""tests/unit starts no process: while a unit test sets up and runs, starting a child process (subprocess,
os.fork/posix_spawn/system, multiprocessing) or Ray fails the test with where it belongs instead. Threads,
sockets and in-process servers are fine; so is typer's CliRunner (the CLI in this process)."""

import multiprocessing.util
import os
import platform
import subprocess
import sys

import pytest

# The standard library's own probe: platform.processor() runs `uname -p` once a process and caches it (the run
# manifest records platform.platform()). Asked here, before any test, so the guard sees only what tests start.
platform.platform()

WHERE = ("tests/unit starts no engine, no Ray and no child process: a test that needs {what} belongs in "
         "tests/e2e (Ray, servers, `bench` or any other child process) or tests/engines (one engine, in process "
         "or in its own child)")


class StartedAProcess(AssertionError):
    pass


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise StartedAProcess(WHERE.format(what=what))
    return refuse


def _child(self, args, *rest, **kwargs):
    shown = args if isinstance(args, (str, bytes)) else " ".join(map(str, list(args)[:3]))
    raise StartedAProcess(WHERE.format(what=f"a child process ({shown!s:.120})"))


def _guarded(item):
    if "ray_local" in item.fixturenames:
        raise StartedAProcess(WHERE.format(what="the ray_local cluster"))
    mp = pytest.MonkeyPatch()
    mp.setattr(subprocess.Popen, "_execute_child", _child)
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            mp.setattr(os, name, _refuse(f"os.{name}"))
    mp.setattr(multiprocessing.util, "spawnv_passfds", _refuse("a multiprocessing child"))
    ray = sys.modules.get("ray")
    if ray is not None and hasattr(ray, "init"):
        mp.setattr(ray, "init", _refuse("ray.init"))
    return mp


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    mp = _guarded(item)
    try:
        yield
    finally:
        mp.undo()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    mp = _guarded(item)
    try:
        yield
    finally:
        mp.undo()
