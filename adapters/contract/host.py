"""What a host is, said once: `host_facts()` gathers it where it runs (the driver for the manifest, the
engine child for every cell's row), in one shape (`HostFacts`). The engine's own CUDA version is in
the cell's `versions`; names of hosts and users are never gathered."""

from __future__ import annotations

import os
import platform

from pydantic import BaseModel, ConfigDict


class GpuFacts(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    memory_bytes: int | None = None


class HostFacts(BaseModel):
    """The node's CPU and memory, and where NVML answers, its GPUs and the NVIDIA driver."""

    model_config = ConfigDict(extra="allow")   # a later version's keys survive being read here

    cpu: str
    cpu_count: int | None = None
    memory_bytes: int | None = None
    os: str | None = None
    machine: str | None = None
    python: str | None = None
    gpus: list[GpuFacts] | None = None        # None: NVML did not answer (`nvml` says why)
    nvidia_driver: str | None = None
    cuda_driver: int | None = None
    nvml: str | None = None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def host_facts() -> HostFacts:
    facts = HostFacts(cpu=_cpu_model(), cpu_count=os.cpu_count(), memory_bytes=_memory_bytes(),
                      os=platform.platform(terse=True), machine=platform.machine(), python=platform.python_version())
    try:
        import pynvml

        pynvml.nvmlInit()
        facts.nvidia_driver = str(pynvml.nvmlSystemGetDriverVersion())
        facts.cuda_driver = pynvml.nvmlSystemGetCudaDriverVersion()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        facts.gpus = [GpuFacts(name=str(pynvml.nvmlDeviceGetName(h)),
                               memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(h).total)) for h in handles]
    except Exception as err:   # no NVML (a CPU host, or the library missing): said, not guessed
        facts.nvml = f"unavailable: {type(err).__name__}"
    return facts
