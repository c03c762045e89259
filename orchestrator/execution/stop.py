"""SIGTERM stops `bench` as Ctrl-C does: a KeyboardInterrupt in the main thread, so the run ends the way an
interrupted run always has (every stored cell kept, the lock released, the local cluster ended; the cells in
flight rerun on resume), and the process exits 143 (128 + SIGTERM) with one line. Ray's init would install
handlers of its own (the driver's sys.exit(15); a head node started in this process kills its processes and
exits 1, printing its crash dump): init_ray keeps them out (scheduling/scheduler.py)."""

from __future__ import annotations

import signal
import threading

EXIT_CODE = 128 + signal.SIGTERM
_received: list[int] = []


def stop_on_sigterm() -> None:
    """(Re)install the handler; a no-op off the main thread, where Python takes no signal handler."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum, frame) -> None:
    _received.append(signum)
    raise KeyboardInterrupt


def terminated() -> bool:
    """Whether a SIGTERM stopped this process."""
    return bool(_received)
