"""The cell ids of every shipped matrix: a cell id names a cell's results in every stored run, so a
refactor that changes one orphans them. tests/data/cell_ids.json holds each matrix's ids as they were
when it was written; regenerate on purpose only (BENCH_GOLDEN_WRITE=1 pytest this file)."""

import json
import os

import pytest

from orchestrator.matrix.cells import expand
from orchestrator.matrix.validate import load_matrix
from tests.helpers import ROOT

GOLDEN = ROOT / "tests" / "data" / "cell_ids.json"
SHIPPED = sorted([*ROOT.glob("matrices/*.yaml"), ROOT / "cluster" / "gpu-sweep.yaml", ROOT / "tests/data/golden/matrix.yaml"])


def _ids() -> dict[str, list[str]]:
    out = {}
    for path in SHIPPED:
        m, _ = load_matrix(path)
        out[str(path.relative_to(ROOT))] = [f"{c.cell_id} {c.engine_key}" for c in expand(m)]
    return out


def test_shipped_matrices_keep_their_cell_ids(monkeypatch):
    monkeypatch.chdir(ROOT)   # matrices name their data files relative to the repository
    got = _ids()
    if os.environ.get("BENCH_GOLDEN_WRITE"):
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        pytest.skip("cell ids written")
    want = json.loads(GOLDEN.read_text())
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], name
