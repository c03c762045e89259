"""The GPU check: every engine adapter on a CUDA GPU, through the real run path, against transformers.

It runs matrices/gpu-check.yaml with `orchestrator.execution.runner.run_matrix` (hf on cuda, vllm, trtllm,
lmdeploy on both its engines) and checks, per engine:
- every cell is `ok`;
- its teacher-forced prompt logprobs are within MAX_ABS of transformers at the same precision and
  batch size 1 (the same token ids, position by position), and its greedy continuations match
  transformers' for at least GREEDY_MATCH of the prompts;
- its memory was sampled through NVML over the worker's process tree (mem_source "nvml-tree") and
  its peak is above zero.

Skipped where there is no CUDA GPU, and for no other reason. On a CUDA machine an engine that is
missing (its rows say `environment not installed`) or whose cells come back `unsupported` for any
reason FAILS, unless the run says `--allow-missing ENGINE` (repeatable, e.g. `pytest tests/gpu
--allow-missing trtllm --allow-missing lmdeploy`): then its unsupported cells are left out and named,
and a test with no cell left is skipped with their reason. Failed cells always fail.

Knobs: LOSSLESS_BENCH_GPU_MODEL replaces the built-in tiny model (a local HF checkpoint dir or hub
id); LOSSLESS_BENCH_PYTHON_<FRAMEWORK> (e.g. LOSSLESS_BENCH_PYTHON_TRTLLM=/opt/trt/bin/python) sets
run.python for one framework; otherwise each framework uses .venvs/<framework>, else this interpreter.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MATRIX = ROOT / "matrices" / "gpu-check.yaml"
ENGINES = ["hf", "vllm", "trtllm", "lmdeploy"]

# Against transformers at the same precision. fp16 kernels differ in accumulation order (and the
# engines fuse differently), so fp16 gets a loose bound; fp32 only has reduction-order noise.
MAX_ABS = {"fp32": 5e-3, "fp16": 5e-2, "bf16": 1e-1}
GREEDY_MATCH = {"fp32": 1.0, "fp16": 0.75, "bf16": 0.5}


def _no_cuda_gpu() -> str | None:
    """Why this machine has no CUDA GPU, or None when it has one: nvidia-smi lists a GPU, or this
    interpreter's torch sees one. Whatever else is missing on a GPU machine (an engine, a CUDA torch
    in an engine's environment) shows in the rows and fails the tests (see --allow-missing)."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            listed = ""
        if re.search(r"^GPU \d+:", listed, re.MULTILINE):
            return None
    try:
        import torch

        if torch.cuda.is_available():
            return None
    except ImportError:
        pass
    return "nvidia-smi lists no GPU" if smi else "nvidia-smi not found and torch sees no GPU"


NO_CUDA_GPU = _no_cuda_gpu()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(NO_CUDA_GPU is not None, reason=f"no CUDA GPU ({NO_CUDA_GPU})")]


@pytest.fixture(scope="session")
def allowed_missing(request) -> set[str]:
    """Engines the run lets be missing or unsupported (--allow-missing ENGINE, registered in tests/conftest.py)."""
    allowed = set(request.config.getoption("allow_missing") or [])
    unknown = allowed - set(ENGINES)
    if unknown:
        raise pytest.UsageError(f"--allow-missing {', '.join(sorted(unknown))}: not an engine of this check "
                                f"(engines: {', '.join(ENGINES)})")
    return allowed


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory):
    from orchestrator.execution.runner import run_matrix

    data = yaml.safe_load(MATRIX.read_text())
    if os.environ.get("LOSSLESS_BENCH_GPU_MODEL"):
        data["models"]["tiny"] = os.environ["LOSSLESS_BENCH_GPU_MODEL"]
    for fw in ENGINES:
        python = os.environ.get(f"LOSSLESS_BENCH_PYTHON_{fw.upper()}")
        if python:
            data["run"].setdefault("python", {})[fw] = python
    d = tmp_path_factory.mktemp("gpu-check")
    path = d / "gpu-check.yaml"
    path.write_text(yaml.safe_dump(data))
    store = run_matrix(path, d / "run")
    cells = store.read_cells()
    lp_dir = store.root / "logprobs"
    logprobs = pd.read_parquet(lp_dir) if lp_dir.exists() else pd.DataFrame()
    return cells, logprobs


def _describe(rows: pd.DataFrame) -> str:
    return "; ".join(f"{r.flags}/{r.quantization}/bs{r.batch_size}: {r.status}: {(r.reason or '')[:600]}"
                     for r in rows.itertuples())


def _rows_of(cells: pd.DataFrame, framework: str, allowed_missing: set[str]) -> pd.DataFrame:
    """The framework's rows, all `ok`. On this CUDA machine a missing engine or an unsupported cell
    fails, unless --allow-missing names the framework (then those cells are left out, and named)."""
    rows = cells[cells.framework == framework]
    if rows.empty:
        pytest.fail(f"no {framework} rows in the run")
    absent = rows[rows.status == "unsupported"]
    if not absent.empty:
        if framework not in allowed_missing:
            pytest.fail(f"{framework}: {len(absent)} of {len(rows)} cells unsupported on this CUDA machine "
                        f"(install the engine, or pass --allow-missing {framework} to accept it): "
                        + _describe(absent))
        print(f"\n{framework}: left out (--allow-missing {framework}): {_describe(absent)}")
        rows = rows[rows.status != "unsupported"]
        if rows.empty:
            pytest.skip(f"{framework} missing, allowed by --allow-missing {framework}: {absent.reason.iloc[0]}")
    bad = rows[rows.status != "ok"]
    if not bad.empty:
        pytest.fail(f"{framework}: " + _describe(bad))
    return rows


def _baseline(cells: pd.DataFrame, quantization: str) -> str:
    base = cells[(cells.framework == "hf") & (cells.quantization == quantization) & (cells.batch_size == 1)
                 & (cells.status == "ok")]
    if base.empty:
        pytest.fail(f"no ok transformers {quantization} batch-1 cell to compare with: "
                    f"{cells[cells.framework == 'hf'][['quantization', 'status', 'reason']].to_dict('records')}")
    return base.cell_id.iloc[0]


def _prompt_rows(logprobs: pd.DataFrame, cell_id: str) -> pd.DataFrame:
    rows = logprobs[(logprobs.cell_id == cell_id) & (logprobs.kind == "prompt") & (logprobs.repeat == 0)]
    return rows.set_index(["prompt_index", "position"]).sort_index()


def _greedy_sequences(logprobs: pd.DataFrame, cell_id: str) -> dict[int, list[int]]:
    rows = logprobs[(logprobs.cell_id == cell_id) & (logprobs.kind == "generation") & (logprobs.repeat == 0)]
    return {int(i): g.sort_values("position").token_id.tolist() for i, g in rows.groupby("prompt_index")}


@pytest.mark.parametrize("framework", ENGINES)
def test_engine_matches_transformers(gpu_run, allowed_missing, framework):
    cells, logprobs = gpu_run
    rows = _rows_of(cells, framework, allowed_missing)
    report = []
    for cell in rows.itertuples():
        base_id = _baseline(cells, cell.quantization)
        if cell.cell_id == base_id:
            continue
        ours, ref = _prompt_rows(logprobs, cell.cell_id), _prompt_rows(logprobs, base_id)
        assert len(ours) == len(ref) and len(ours) > 0, f"{cell.cell_id}: {len(ours)} prompt rows vs {len(ref)}"
        assert (ours.token_id.to_numpy() == ref.token_id.to_numpy()).all(), "scored different prompt tokens"
        max_abs = float(np.max(np.abs(ours.logprob.to_numpy(np.float64) - ref.logprob.to_numpy(np.float64))))
        top1 = float(np.mean([a[0] == b[0] for a, b in zip(ours.topk_ids, ref.topk_ids)]))
        g_ours, g_ref = _greedy_sequences(logprobs, cell.cell_id), _greedy_sequences(logprobs, base_id)
        assert g_ours.keys() == g_ref.keys() and g_ours, "greedy rows missing"
        match = float(np.mean([g_ours[i] == g_ref[i] for i in g_ref]))
        report.append((cell.flags, cell.quantization, cell.batch_size, max_abs, top1, match))
        q = cell.quantization
        assert max_abs <= MAX_ABS[q], f"{framework} {cell.flags} {q} bs{cell.batch_size}: prompt logprobs differ " \
                                      f"from transformers by up to {max_abs:.3g} (> {MAX_ABS[q]})"
        assert match >= GREEDY_MATCH[q], f"{framework} {cell.flags} {q} bs{cell.batch_size}: greedy matches " \
                                         f"transformers on {match:.0%} of prompts (< {GREEDY_MATCH[q]:.0%})"
    print(f"\n{framework} vs transformers (flags, quant, batch, max|dlogprob|, top-1 agreement, greedy match):")
    for line in report:
        print("  ", line)


@pytest.mark.parametrize("framework", ENGINES)
def test_memory_is_sampled_through_nvml(gpu_run, allowed_missing, framework):
    cells, _ = gpu_run
    rows = _rows_of(cells, framework, allowed_missing)
    assert set(rows.mem_source) == {"nvml-tree"}, f"{framework}: mem_source {set(rows.mem_source)} (pynvml missing " \
                                                  f"in its environment? install nvidia-ml-py)"
    assert (rows.peak_mem_bytes > 0).all() and (rows.load_peak_mem_bytes > 0).all()


@pytest.mark.parametrize("framework", ENGINES)
def test_timings_are_sane(gpu_run, allowed_missing, framework):
    cells, _ = gpu_run
    for r in _rows_of(cells, framework, allowed_missing).itertuples():
        assert r.requests == r.repeats * r.batch_size
        assert 0 < r.ttft_ms_p50 <= r.e2e_ms_p50 and r.output_tok_s > 0
