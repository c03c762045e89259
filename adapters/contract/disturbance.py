"""How disturbed one timed repeat was by the rest of the host, measured once here (`Disturbance`).

CPU: the share of the engine cores' time (the cores this process may run on, `sched_getaffinity`) that
other processes took during the repeat: the busy time of those cores in /proc/stat (user, nice, system,
irq, softirq, steal) minus the CPU time of the engine's own processes (every process of this process's
session in /proc/PID/stat: the engine child leads its own session, and an engine's processes stay in
it, adapters/contract/processes.py), over the repeat's wall time times the core count; clamped to [0, 1].
Those counters move in whole clock ticks (10 ms at the usual 100 Hz), and each core's and each of the engine's
processes' count can be a tick off at either end: over a few-ms repeat (a tiny model's batch) one tick of anyone's
reads as a whole core. So a repeat shorter than the window whose rounding stays within half of DISTURBED_SHARE
(`resolvable_s`: about 0.16 s on 2 cores) is measured over that window up to its end: reaching back over the
cell's earlier repeats, and after the cell's first such repeat an untimed pause that completes the window.
GPU: where NVML answers, the mean SM utilisation (percent / 100) that processes outside this session
had on the visible GPUs during the repeat (nvmlDeviceGetProcessUtilization); null with the reason
otherwise. Both are stored per repeat (CellRecord.host_busy_runs, gpu_busy_runs)."""

from __future__ import annotations

import os
import time
from typing import Callable, TypeVar

T = TypeVar("T")

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_BUSY = (0, 1, 2, 5, 6, 7)   # /proc/stat cpuN fields: user nice system (idle iowait) irq softirq steal


def _cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def cores_busy_ticks(cores: list[int]) -> int | None:
    """The summed busy ticks of `cores` since boot (None: no /proc/stat)."""
    want, total = {f"cpu{c}" for c in cores}, 0
    try:
        with open("/proc/stat") as f:
            for line in f:
                parts = line.split()
                if parts and parts[0] in want:
                    total += sum(int(parts[1 + i]) for i in _BUSY if 1 + i < len(parts))
    except OSError:
        return None
    return total


def session_pids(session: int | None = None) -> list[int]:
    """Every live process of this process's session (the engine's process tree)."""
    session = os.getsid(0) if session is None else session
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = _stat(int(name))
            if stat is not None and int(stat[3]) == session:
                pids.append(int(name))
    return pids


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state is [0], session [3], utime [11])."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


def session_ticks(session: int | None = None) -> tuple[int, int]:
    """(CPU ticks the session's processes used: each live one's utime + stime + its reaped children's, how many
    processes were counted)."""
    total = counted = 0
    for pid in session_pids(session):
        stat = _stat(pid)
        if stat is not None:
            total += sum(int(x) for x in stat[11:15])
            counted += 1
    return total, counted


def resolvable_s(cores: int, processes: int) -> float:
    """The shortest window over which the tick rounding (a tick per core and two per process, utime and stime)
    stays within half of DISTURBED_SHARE of the cores' time."""
    return (cores + 2 * processes) / (DISTURBED_SHARE / 2) / (_TICK * cores)


class Disturbance:
    """Measures each repeat it wraps; `cpu`, `gpu` hold one share per repeat, `missing` why one is null."""

    def __init__(self, reach_back: bool = True) -> None:
        # reach_back=False: repeats that take turns with another engine's (an env pair, a timing twin) are measured
        # over their own span and a pause, never over the gaps between them, where the other side's work ran
        self.reach_back = reach_back
        self.cores = _cores()
        self.cpu: list[float] = []
        self.gpu: list[float] = []
        self.missing: dict[str, str] = {}
        self._nvml = _nvml_handles(self.missing)
        self._marks: list[tuple[float, int, int]] = []   # (time, cores' busy ticks, the session's ticks): repeat edges

    def _mark(self) -> tuple[tuple[float, int, int] | None, int]:
        busy, (own, processes) = cores_busy_ticks(self.cores), session_ticks()
        return (None if busy is None else (time.time(), busy, own)), processes

    def measure(self, fn: Callable[[], T]) -> T:
        start, _ = self._mark()
        gpu_since = int(time.time() * 1e6)
        result = fn()
        end, processes = self._mark()
        if start is None or end is None:
            self.missing.setdefault("host_busy_runs", "no /proc/stat on this host")
        else:
            need = resolvable_s(len(self.cores), processes)
            edges = (*self._marks, start) if self.reach_back else (start,)
            back = [m for m in edges if end[0] - m[0] >= need]
            since = back[-1] if back else edges[0]
            if not back:   # not even the cell's first edge is far enough back: an untimed pause completes it
                time.sleep(need - (end[0] - since[0]))
                end = self._mark()[0] or end
            self._marks += [start, end]
            other = (end[1] - since[1]) - (end[2] - since[2])
            self.cpu.append(min(1.0, max(0.0, other / max((end[0] - since[0]) * _TICK * len(self.cores), 1e-9))))
        if self._nvml:
            share = _gpu_other_share(self._nvml, gpu_since, set(session_pids()), self.missing)
            if share is not None:
                self.gpu.append(share)
        return result

    def figures(self) -> dict:
        """The CellRecord fields: per-repeat shares (None where not measured, `missing` says why)."""
        return {"host_busy_runs": self.cpu if "host_busy_runs" not in self.missing else None,
                "gpu_busy_runs": self.gpu if "gpu_busy_runs" not in self.missing else None}


def _nvml_handles(missing: dict[str, str]) -> list:
    try:
        import pynvml

        pynvml.nvmlInit()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        count = pynvml.nvmlDeviceGetCount()
        indices = [int(i) for i in visible.split(",") if i.strip().isdigit()] if visible else range(count)
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in indices if i < count]
    except Exception as err:   # no NVML: a CPU host, or the library missing
        missing["gpu_busy_runs"] = f"NVML unavailable: {type(err).__name__}"
        return []
    if not handles:
        missing["gpu_busy_runs"] = "no GPU visible to the engine"
    return handles


def _gpu_other_share(handles: list, since_us: int, ours: set[int], missing: dict[str, str]) -> float | None:
    import pynvml

    total = 0.0
    for h in handles:
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(h, since_us)
        except pynvml.NVMLError_NotFound:   # no process sampled on it since: nobody else used it
            continue
        except Exception as err:
            missing["gpu_busy_runs"] = f"NVML gave no per-process utilisation: {type(err).__name__}"
            return None
        others: dict[int, list[int]] = {}
        for s in samples:
            if s.pid not in ours:
                others.setdefault(s.pid, []).append(s.smUtil)
        total += sum(sum(v) / len(v) for v in others.values()) / 100.0
    return min(1.0, total / len(handles))


# a repeat is disturbed when other processes took more than this share of the engine cores' time, or of its
# GPUs: a quarter of the cores is what a single busy loop takes on a 4-core node (docs/verdicts.md)
DISTURBED_SHARE = 0.25


def disturbed_flags(cpu, gpu=None) -> list[bool]:
    """Per timed repeat of one cell's shares: whether other processes took more than DISTURBED_SHARE of its
    engine cores or GPUs ([] where none was measured)."""
    def shares(x) -> list[float]:
        return [float(v) for v in x] if x is not None and hasattr(x, "__len__") else []
    c, g = shares(cpu), shares(gpu)
    return [max(c[i] if i < len(c) else 0.0, g[i] if i < len(g) else 0.0) > DISTURBED_SHARE
            for i in range(max(len(c), len(g)))]


def disturbed_repeats(cpu, gpu=None) -> tuple[int, int] | None:
    """(repeats disturbed, repeats measured) of one cell's per-repeat shares; None: none measured."""
    flags = disturbed_flags(cpu, gpu)
    return (sum(flags), len(flags)) if flags else None


def split_pairs(cpu_a, gpu_a, cpu_b, gpu_b) -> tuple[int, int] | None:
    """(pairs split, pairs measured) of two cells whose timed repeats took turns (repeat i of one beside repeat i
    of the other): a pair is split where one of its repeats was disturbed and the other not, so the load did not
    fall on both. None where the two sides' repeats were not both measured, one for one."""
    a, b = disturbed_flags(cpu_a, gpu_a), disturbed_flags(cpu_b, gpu_b)
    if not a or len(a) != len(b):
        return None
    return sum(x != y for x, y in zip(a, b)), len(a)
