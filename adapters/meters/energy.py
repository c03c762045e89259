"""Energy of a cell's timed runs from the hardware's own counters, kept apart from the engines (as the
memory tracker is: adapters/meters/memory.py).

- CUDA: NVML's total-energy counter of each GPU the worker may use (`nvmlDeviceGetTotalEnergyConsumption`,
  millijoules since the driver loaded; Volta and later), CUDA_VISIBLE_DEVICES mapped to NVML devices.
- CPU: the kernel's RAPL package counters (`/sys/class/powercap/intel-rapl:N/energy_uj`, one per
  socket; AMD's too under that name), microjoules that wrap at `max_energy_range_uj`.

Both count the whole device or package, every process on it (the engine, its server, the load
generator, anything else running there): `energy_source` says which counters were read. The counters
are read just before and just after each timed run, outside the engine's timing, and the differences
summed, so a wrap is at most one per run (RAPL wraps after minutes to hours). Where no counter can be
read the figures are null with the reason (no RAPL zone, permission denied, NVML missing or not
supported).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")
POWERCAP = Path("/sys/class/powercap")
_PACKAGE = re.compile(r"intel-rapl:\d+$")   # top-level zones: packages (subzones intel-rapl:N:M are inside them)
FIGURES = ("energy_j", "energy_j_per_token")


class EnergyMeter:
    """Joules over the calls wrapped by `measure`, since `reset`. `unavailable` says why there is no number."""

    def __init__(self, device: str = "cpu", powercap: Path = POWERCAP, nvml=None):
        self.device = device
        self.unavailable: str | None = None
        self.source: str | None = None
        self.joules = 0.0
        self.runs, self.seconds = 0, 0.0   # the timed calls measured since reset, and their wall time
        self._read: Callable[[], list[float]] | None = None
        self._wrap: list[float] = []
        try:
            if device == "cuda":
                self._init_nvml(nvml)
            else:
                self._init_rapl(Path(powercap))
        except Exception as err:   # a counter that exists but cannot be read: say why, never a number
            self.unavailable = f"{type(err).__name__}: {err}"
            self._read = None

    # ---------------------------------------------------------------- CPU: RAPL
    def _init_rapl(self, root: Path) -> None:
        zones = sorted(p for p in root.glob("intel-rapl:*") if _PACKAGE.search(p.name)) if root.is_dir() else []
        if not zones:
            self.unavailable = (f"no RAPL counter under {root} (the kernel or this container exposes none): "
                                "CPU energy not measured")
            return
        files = [z / "energy_uj" for z in zones]
        try:
            names = [(z / "name").read_text().strip() for z in zones]
            self._wrap = [float((z / "max_energy_range_uj").read_text()) / 1e6 for z in zones]
            for f in files:
                f.read_text()
        except PermissionError as err:
            self.unavailable = (f"permission denied reading {err.filename} (RAPL energy is root-only since Linux "
                                "5.10): CPU energy not measured")
            return
        self._read = lambda: [float(f.read_text()) / 1e6 for f in files]
        self.source = "rapl:" + ",".join(names)

    # ---------------------------------------------------------------- CUDA: NVML
    def _init_nvml(self, nvml) -> None:
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError:
                self.unavailable = "NVML unavailable in this engine environment (install nvidia-ml-py): GPU energy not measured"
                return
        nvml.nvmlInit()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is None or visible.strip() == "":
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        else:
            ids = [v.strip() for v in visible.split(",") if v.strip()]
            handles = [nvml.nvmlDeviceGetHandleByUUID(v) if not v.isdigit() else nvml.nvmlDeviceGetHandleByIndex(int(v))
                       for v in ids]
        if not handles:
            self.unavailable = "NVML lists no GPU for this worker: GPU energy not measured"
            return
        try:
            for h in handles:
                nvml.nvmlDeviceGetTotalEnergyConsumption(h)
        except Exception as err:   # NVMLError_NotSupported before Volta
            self.unavailable = f"NVML has no total-energy counter on this GPU ({type(err).__name__}: {err})"
            return
        # millijoules, a 64-bit count since the driver loaded: it does not wrap in practice
        self._read = lambda: [nvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1e3 for h in handles]
        self._wrap = [0.0] * len(handles)
        self.source = f"nvml:{len(handles)} GPU(s)"

    # ---------------------------------------------------------------- measuring
    def reset(self) -> None:
        self.joules = 0.0
        self.runs, self.seconds = 0, 0.0

    def measure(self, fn: Callable[[], T]) -> T:
        """fn(), with the counters read just before and after it; the joules between are added up."""
        if self._read is None:
            return fn()
        before, t0 = self._read(), time.perf_counter()
        out = fn()
        after = self._read()
        self.runs, self.seconds = self.runs + 1, self.seconds + time.perf_counter() - t0
        for b, a, wrap in zip(before, after, self._wrap):
            self.joules += a - b if a >= b or not wrap else a + wrap - b
        return out

    def figures(self, output_tokens: int) -> tuple[dict, dict[str, str]]:
        """(energy_j, energy_j_per_token, energy_source) since reset, or null with the reason."""
        if self.unavailable or self._read is None:
            why = self.unavailable or "no energy counter"
            return {"energy_j": None, "energy_j_per_token": None, "energy_source": None}, dict.fromkeys(FIGURES, why)
        if not self.joules:
            # a counter that did not move measured nothing (NVML's updates every few tens of ms on some
            # GPUs; a tiny model's runs can be shorter): no zero joules
            why = (f"the energy counters did not advance over {self.runs} timed runs ({self.seconds * 1e3:.1f} ms): "
                   "shorter than their update interval" if self.runs else "no timed run was measured")
            return {"energy_j": None, "energy_j_per_token": None, "energy_source": None}, dict.fromkeys(FIGURES, why)
        missing = {} if output_tokens else {"energy_j_per_token": "no output token in the timed runs"}
        return {"energy_j": self.joules, "energy_j_per_token": self.joules / output_tokens if output_tokens else None,
                "energy_source": self.source}, missing
