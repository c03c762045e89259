"""`bench run` with models the preflight rules out (orchestrator/execution/preflight.py): a hub id this machine
cannot have is one message before any engine starts and its cells are `failed` with it, with no retry loop per
cell; a pair its engine cannot run is an `unsupported` row; the rest runs. (The preflight's parts: unit/test_preflight.py.)"""

import json
import os
import subprocess
import time

import pandas as pd

from tests.helpers import ROOT, bench_cmd

NO_SUCH_HUB_ID = "lossless-bench-tests/no-such-model-3f9c"


def test_a_hub_id_that_cannot_be_had_fails_its_cells_up_front(write_matrix, tmp_path):
    matrix = {"name": "pf", "models": {"remote": NO_SUCH_HUB_ID},
              "axes": {"framework": ["hf", "vllm"], "model": ["remote"], "batch_size": [1, 2], "input_len": [8],
                       "output_len": [2]}}
    run_dir = tmp_path / "run"
    t0 = time.monotonic()
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub")}   # an empty Hugging Face cache
    env.pop("HF_HUB_OFFLINE", None)                                 # the hub is asked (once)
    proc = subprocess.run(bench_cmd("run", str(write_matrix(matrix)), "--run-dir", str(run_dir)), cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)
    took = time.monotonic() - t0
    out = " ".join((proc.stdout + proc.stderr).split())   # the console wraps long lines
    print(f"\nbench run with an unreachable hub id: {took:.1f} s (no model to run: Ray is not started)")
    assert out.count("preflight: model remote:") == 1, out[-3000:]
    said = out.split("preflight: model remote:")[1]
    assert said.startswith(f" hub id {NO_SUCH_HUB_ID}") and "its 4 cells fail without starting an engine" in said
    cells = pd.read_parquet(run_dir / "cells")
    assert len(cells) == 4 and set(cells.status) == {"failed"}
    assert all(r.startswith("preflight: hub id " + NO_SUCH_HUB_ID) for r in cells.reason)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["sessions"][-1]["ended"]
    # before this preflight each cell retried the hub for ~99 s after its engine group started; measured now: 5.4 s
    # for the whole command on a loaded 2-core machine (no Ray: no model of the matrix can be had)
    assert took < 20, f"{took:.1f} s"
