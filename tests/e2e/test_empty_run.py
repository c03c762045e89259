"""A run dir with its manifest and no cell (a run stopped while Ray started, issue 41): show --format csv,
compare and export say so in one line and exit 0, through the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from orchestrator.store.run_store import RunStore
from tests.helpers import ROOT


@pytest.mark.parametrize("args", [["show", "--format", "csv"], ["compare"], ["export", "--format", "csv"]],
                         ids=["show-csv", "compare", "export"])
def test_an_empty_run_says_no_cells_stored_yet(tmp_path, args):
    run = tmp_path / "run"
    RunStore(run).write_manifest({"run_id": "run", "matrix": {
        "name": "x", "baseline": {"framework": "hf", "quantization": "fp32"}, "tolerances": {}}})
    res = subprocess.run([sys.executable, "-m", "orchestrator.cli", args[0], str(run), *args[1:]], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.strip()]
    assert res.returncode == 0 and lines == [f"{run}: no cells stored yet (`bench run` into it resumes the run)"], lines
    assert not (run / "export").exists()
