"""How a process the harness starts ends with the one that started it (the engine child, a server).
"""

from __future__ import annotations

import ctypes
import signal


def die_with_parent() -> None:
    """In a child, before exec: the kernel kills it when its parent dies (it must not outlive it)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
