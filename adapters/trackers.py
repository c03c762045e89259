"""Trackers kept apart from the engines: peak memory of the process tree, and latency statistics."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import psutil

from adapters.base import BatchTiming


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
    """

    def __init__(self, device: str = "cpu", interval_s: float = 0.02):
        self.device = device
        self.interval_s = interval_s
        self.extra_pids: list[int] = []
        self._peak = 0
        self._stop = threading.Event()
        self._nvml = None
        if device == "cuda":
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml
            except Exception:  # no NVML: fall back to RSS, and say so in mem_source
                self._nvml = None
        self._marks = self._nvml is None and _reset_high_water(os.getpid())
        self._thread = threading.Thread(target=self._loop, daemon=True)

    @property
    def source(self) -> str:
        return "nvml-tree" if self._nvml else "rss-peak-tree" if self._marks else "rss-tree"

    def start(self) -> "MemoryTracker":
        if not self._marks:
            self._thread.start()
        return self

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
        if self._nvml:
            total = 0
            for i in range(self._nvml.nvmlDeviceGetCount()):
                handle = self._nvml.nvmlDeviceGetHandleByIndex(i)
                for p in self._nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    if p.pid in pids and p.usedGpuMemory:
                        total += p.usedGpuMemory
            return total
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

    def peak(self) -> int:
        if self._marks:  # a process that ended since the reset is not counted: the engine's run while timed
            return max(self._peak, sum(_rss_high_water(pid) or 0 for pid in self._pids()))
        return max(self._peak, self.sample())

    def stop(self) -> None:
        self._stop.set()


def percentiles(values: list[float], prefix: str) -> dict[str, float | None]:
    arr = np.asarray(values, dtype=np.float64)
    out = {}
    for q in (50, 90, 99):
        out[f"{prefix}_p{q}"] = float(np.percentile(arr, q)) if arr.size else None
    return out


def latency_stats(timings: list[BatchTiming]) -> dict:
    """Per-request TTFT, TPOT, ITL and end-to-end (ms) and throughputs from timed batches."""
    ttft, tpot, itl, e2e, tok_s, total_s, req_s, engine_ttft = [], [], [], [], [], [], [], []
    for t in timings:
        elapsed = t.end - t.start
        for i, first in enumerate(t.first_token):
            times = t.token_times[i] if t.token_times else []
            done = times[-1] if times else t.end
            ttft.append((first - t.start) * 1e3)
            e2e.append((done - t.start) * 1e3)
            n = t.output_tokens[i]
            if n > 1:
                tpot.append((done - first) * 1e3 / (n - 1))
            itl.extend(np.diff(times) * 1e3 if len(times) > 1 else [])
        tok_s.append(sum(t.output_tokens) / elapsed)
        total_s.append((sum(t.output_tokens) + sum(t.prompt_tokens)) / elapsed)
        req_s.append(len(t.first_token) / elapsed)
        if t.engine_ttft_s:
            engine_ttft.extend(x * 1e3 for x in t.engine_ttft_s)
    stats = {"ttft_ms": ttft, "tpot_ms": tpot, "e2e_ms": e2e, "output_tok_s_runs": tok_s,
             "engine_ttft_ms": engine_ttft or None,
             "output_tok_s": float(np.mean(tok_s)), "total_tok_s": float(np.mean(total_s)),
             "req_s": float(np.mean(req_s)), "requests": len(ttft),
             "output_tokens": sum(sum(t.output_tokens) for t in timings),
             "prompt_tokens": sum(sum(t.prompt_tokens) for t in timings)}
    for name, values in (("ttft_ms", ttft), ("tpot_ms", tpot), ("itl_ms", itl), ("e2e_ms", e2e)):
        stats.update(percentiles(values, name))
    return stats
