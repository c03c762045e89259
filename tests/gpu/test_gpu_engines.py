"""The GPU check: every engine adapter on a CUDA GPU, through the real run path, against transformers.

It runs matrices/gpu-check.yaml with `orchestrator.runner.run_matrix` (hf on cuda, vllm, trtllm,
lmdeploy on both its engines) and checks, per engine:
- every cell is `ok`;
- its teacher-forced prompt logprobs are within MAX_ABS of transformers at the same precision and
  batch size 1 (the same token ids, position by position), and its greedy continuations match
  transformers' for at least GREEDY_MATCH of the prompts;
- its memory was sampled through NVML over the worker's process tree (mem_source "nvml-tree") and
  its peak is above zero.

Skipped, with the reason, where there is no CUDA GPU; an engine whose environment is not installed
(its rows say `environment not installed`) or whose adapter is not written is skipped on its own.

Knobs: LOSSLESS_BENCH_GPU_MODEL replaces the built-in tiny model (a local HF checkpoint dir or hub
id); LOSSLESS_BENCH_PYTHON_<FRAMEWORK> (e.g. LOSSLESS_BENCH_PYTHON_TRTLLM=/opt/trt/bin/python) sets
run.python for one framework; otherwise each framework uses .venvs/<framework>, else this interpreter.
"""

from __future__ import annotations

import os
import shutil
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
SKIP_REASONS = ("environment not installed", "is not implemented")


def _cuda_problem() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA driver here (nvidia-smi not found)"
    try:
        import torch
    except ImportError:
        return "torch is not installed in this interpreter"
    if not torch.cuda.is_available():
        return "torch sees no CUDA GPU"
    return None


CUDA_PROBLEM = _cuda_problem()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(CUDA_PROBLEM is not None, reason=f"GPU check: {CUDA_PROBLEM}")]


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory):
    from orchestrator.runner import run_matrix

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


def _rows_of(cells: pd.DataFrame, framework: str) -> pd.DataFrame:
    rows = cells[cells.framework == framework]
    if rows.empty:
        pytest.fail(f"no {framework} rows in the run")
    absent = rows[rows.status == "unsupported"]
    if len(absent) == len(rows) and all(any(s in r for s in SKIP_REASONS) for r in absent.reason):
        pytest.skip(f"{framework}: {absent.reason.iloc[0]}")
    bad = rows[rows.status != "ok"]
    if not bad.empty:
        pytest.fail(f"{framework}: " + "; ".join(f"{r.flags}/{r.quantization}/bs{r.batch_size}: {r.status}: "
                                                 f"{(r.reason or '')[:600]}" for r in bad.itertuples()))
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
def test_engine_matches_transformers(gpu_run, framework):
    cells, logprobs = gpu_run
    rows = _rows_of(cells, framework)
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
def test_memory_is_sampled_through_nvml(gpu_run, framework):
    cells, _ = gpu_run
    rows = _rows_of(cells, framework)
    assert set(rows.mem_source) == {"nvml-tree"}, f"{framework}: mem_source {set(rows.mem_source)} (pynvml missing " \
                                                  f"in its environment? install nvidia-ml-py)"
    assert (rows.peak_mem_bytes > 0).all() and (rows.load_peak_mem_bytes > 0).all()


@pytest.mark.parametrize("framework", ENGINES)
def test_timings_are_sane(gpu_run, framework):
    cells, _ = gpu_run
    for r in _rows_of(cells, framework).itertuples():
        assert r.requests == r.repeats * r.batch_size
        assert 0 < r.ttft_ms_p50 <= r.e2e_ms_p50 and r.output_tok_s > 0
