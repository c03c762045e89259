"""Peak memory of the engine's process tree, kept apart from the engines (latency figures are
adapters.contract.timing.summarize's)."""

from __future__ import annotations

import os
import threading
import time

import psutil


def _rss_high_water(pid: int) -> int | None:
    """The kernel's peak RSS of a process since it started or since its mark was reset (VmHWM), bytes."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_high_water(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")   # 5: reset the peak RSS to the current RSS (proc(5), Linux 4.0+)
        return True
    except OSError:
        return False


class MemoryTracker:
    """The peak memory of this process and all its children (engines fork helpers) since reset_peak().

    On a CPU it reads the kernel's own peak RSS of each process of the tree (VmHWM, reset through
    /proc/<pid>/clear_refs) at reset_peak() and at peak(), both outside any timing: nothing runs
    while the engine is timed. That is exact for one process and, for several, the sum of their peaks
    (an upper bound of their joint peak). A sampling thread instead costs the engine it measures: a
    20 ms RSS sampler took 9-12% of hf's throughput on the built-in model on 2 cores
    (benchmarks/overhead.py, paired table), by waking up inside torch's parallel regions.
    Where the mark cannot be reset (not Linux, a process of another user), it samples every interval_s.
    On CUDA it samples NVML's per-process GPU memory over the same process tree, because engines
    that preallocate a KV cache or run in a child process make torch's own counters meaningless.
    Where NVML lists none of the tree's processes (a container's own PID namespace hides them), it
    falls back to the device's used memory minus what was used when the tracker started (before the
    engine loaded): `nvml-device-delta`, which counts every process on the device. Without NVML on
    CUDA there is no number: peak() says why (host RSS is not GPU memory).
    """

    def __init__(self, device: str = "cpu", interval_s: float = 0.02):
        self.device = device
        self.interval_s = interval_s
        self.extra_pids: list[int] = []
        self._peak = 0
        self._stop = threading.Event()
        self._nvml = None
        self._unmeasured: str | None = None
        self._by_device = False           # NVML saw none of our processes: device used-memory delta
        self._device_base = 0
        if device == "cuda":
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml
                self._device_base = self._device_used()
            except Exception as err:
                self._unmeasured = (f"GPU memory not measured: NVML unavailable in this engine environment "
                                    f"({type(err).__name__}: {err}); install nvidia-ml-py")
        self._marks = device != "cuda" and _reset_high_water(os.getpid())
        self._thread = threading.Thread(target=self._loop, daemon=True)

    @property
    def source(self) -> str:
        if self.device == "cuda":
            return "none" if self._unmeasured else "nvml-device-delta" if self._by_device else "nvml-tree"
        return "rss-peak-tree" if self._marks else "rss-tree"

    def start(self) -> "MemoryTracker":
        if not self._marks and not self._unmeasured:
            self._thread.start()
        return self

    def _device_used(self) -> int:
        nv = self._nvml
        return sum(nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(i)).used
                   for i in range(nv.nvmlDeviceGetCount()))

    def _pids(self) -> set[int]:
        me = psutil.Process(os.getpid())
        pids = {me.pid}
        for proc in [me, *[psutil.Process(p) for p in self.extra_pids if psutil.pid_exists(p)]]:
            try:
                pids.add(proc.pid)
                pids.update(c.pid for c in proc.children(recursive=True))
            except psutil.Error:
                pass
        return pids

    def sample(self) -> int:
        """The tree's memory now (GPU memory with NVML, else the sum of RSS)."""
        pids = self._pids()
        if self._unmeasured:
            return 0
        if self._nvml:
            total, seen = 0, False
            for i in range(self._nvml.nvmlDeviceGetCount()):
                handle = self._nvml.nvmlDeviceGetHandleByIndex(i)
                for p in self._nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    if p.pid in pids:
                        seen = True
                        total += p.usedGpuMemory or 0
            if not seen:
                self._by_device = True
            return max(0, self._device_used() - self._device_base) if self._by_device else total
        total = 0
        for pid in pids:
            try:
                total += psutil.Process(pid).memory_info().rss
            except psutil.Error:
                pass
        return total

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._peak = max(self._peak, self.sample())
            time.sleep(self.interval_s)

    def reset_peak(self) -> None:
        if self._marks and not all(_reset_high_water(pid) for pid in self._pids()):
            self._marks = False   # a process whose mark this one cannot reset: sample from now on
            self._thread.start()
        self._peak = self.sample()

    def peak(self) -> tuple[int | None, str | None]:
        """The peak since reset_peak(), or None and why it was not measured."""
        if self._unmeasured:
            return None, self._unmeasured
        if self._marks:  # a process that ended since the reset is not counted: the engine's run while timed
            return max(self._peak, sum(_rss_high_water(pid) or 0 for pid in self._pids())), None
        return max(self._peak, self.sample()), None

    def stop(self) -> None:
        self._stop.set()
