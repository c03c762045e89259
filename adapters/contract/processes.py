"""How a process the harness starts ends with the one that started it (the engine child, a server), and
how an engine's own processes end with the engine child.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys


def die_with_parent() -> None:
    """In a child, before exec: the kernel kills it when its parent dies (it must not outlive it)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


# the watchdog: its stdin is a pipe only the group's leader holds; at EOF (the leader is gone, however
# it ended) it SIGKILLs its own process group, itself included
_WATCHDOG = """import os, signal
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
while os.read(0, 65536):
    pass
os.killpg(0, signal.SIGKILL)
"""
WATCHDOG_MARK = "lossless-bench-group-watchdog"   # its last argument: how a test tells it from an engine
_lifeline: list[int] = []


def end_group_with_me() -> bool:
    """In the leader of its own process group (the engine child: the supervisor starts it with setsid):
    start a watchdog in the group that SIGKILLs the whole group as soon as this process ends, however it
    ends (kill -9, the OOM killer, die_with_parent, os._exit). An engine's own processes stay in the
    group (vLLM's engine core and its workers, started with multiprocessing's spawn; a server and its
    children; none starts a session of its own), so none outlives the engine child. (vLLM's engine core
    does not watch the process that started it: killed under it, that process left it running as an
    orphan.) False, and nothing started, where this process leads no session of its own (a process a
    shell started leads a group that holds the rest of its pipeline)."""
    if os.getsid(0) != os.getpid() or _lifeline:
        return False
    read_end, write_end = os.pipe()   # not inheritable: no child of this process holds the write end
    try:
        subprocess.Popen([sys.executable, "-S", "-c", _WATCHDOG, WATCHDOG_MARK], stdin=read_end,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    finally:
        os.close(read_end)
    _lifeline.append(write_end)
    return True
