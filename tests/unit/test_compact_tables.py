"""`bench compare` and `bench show` fit a terminal: at 120 columns one line per cell with its verdict and
the figures that decide it; `--wide` keeps every column; `--format csv|json|md` gives the same rows."""

import csv
import io
import json
import shutil

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.report import console
from tests.helpers import ROOT

RUNS = ROOT / "tests" / "data" / "golden" / "runs"
CELLS = ["hf/fp32/default", "llamacpp/fp32/default", "llamacpp/fp32/f32_kv", "llamacpp/fp8/default",
         "llamacpp/q8_0/default"]


@pytest.fixture
def run(tmp_path, monkeypatch):
    shutil.copytree(RUNS / "new", tmp_path / "new")
    monkeypatch.setattr(console.out, "_width", 120)
    return str(tmp_path / "new")


def _first_table(text: str) -> list[str]:
    lines = text.splitlines()
    return lines[:next(i for i, x in enumerate(lines) if x.startswith("--wide"))]


def test_compare_prints_one_line_per_cell_within_120_columns(run):
    res = CliRunner().invoke(app, ["compare", run], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert max(map(len, res.stdout.splitlines())) <= 120
    table = _first_table(res.stdout)
    assert "(model tiny, batch 1)" in table[0]        # what every cell shares is said once
    rows = {name: [x for x in table if x.startswith(name + " ")] for name in CELLS}
    assert all(len(found) == 1 for found in rows.values()), rows   # exactly one line per cell
    line = dict((name, found[0]) for name, found in rows.items())
    assert "identical" in line["hf/fp32/default"] and "bitwise identical" in line["hf/fp32/default"]
    # the verdict, the other layers, the speed-up with its interval and call, and the bound that decided
    assert "near-lossless" in line["llamacpp/q8_0/default"] and "max_abs 0.0813 > atol 1e-3" in line["llamacpp/q8_0/default"]
    assert "15.45x [8.01, 28.5] q=0.0015 faster" in line["llamacpp/q8_0/default"]
    assert "near-lossless" in line["llamacpp/fp32/default"] and "max_abs 1.7e-3 > atol 1e-3" in line["llamacpp/fp32/default"]
    assert "no change" in line["llamacpp/fp32/default"]
    sampling = res.stdout[res.stdout.index("Sampling layer"):].splitlines()   # its own table, one line per cell
    assert sum(x.startswith("llamacpp/fp32/default ") and "not distinguishable" in x for x in sampling) == 1
    assert "n/a" in line["llamacpp/fp8/default"] and "status unsupported" in line["llamacpp/fp8/default"]


def test_show_prints_one_line_per_cell_and_wide_keeps_every_column(run):
    res = CliRunner().invoke(app, ["show", run], catch_exceptions=False)
    assert res.exit_code == 0 and max(map(len, res.stdout.splitlines())) <= 120
    table = _first_table(res.stdout)
    assert all(sum(x.startswith(name + " ") for x in table) == 1 for name in CELLS), res.stdout
    wide = CliRunner().invoke(app, ["show", run, "--wide"], catch_exceptions=False)
    assert "│ hf " in wide.stdout and "│" not in res.stdout   # today's table, every column


def test_formats_give_the_rows_of_the_table_with_every_column(run):
    from orchestrator.judge.analysis import analyse

    columns = list(analyse(run).columns)
    got = json.loads(CliRunner().invoke(app, ["compare", run, "--format", "json"], catch_exceptions=False).stdout)
    assert set(got) == {"cells", "tasks", "sampling", "layers_disagree"} and len(got["cells"]) == 5 and len(got["tasks"]) == 8
    assert len(got["layers_disagree"]) == 2 and got["layers_disagree"][0]["line"].startswith("logits moved")
    assert set(columns) <= set(got["cells"][0])
    q8 = next(c for c in got["cells"] if c["quantization"] == "q8_0")
    assert q8["verdict"] == "near-lossless" and q8["kl_mean"] == pytest.approx(2.8e-4, abs=5e-6)
    rows = list(csv.DictReader(io.StringIO(CliRunner().invoke(app, ["compare", run, "--format", "csv"]).stdout)))
    assert len(rows) == 5 and set(columns) <= set(rows[0])
    md = CliRunner().invoke(app, ["compare", run, "--format", "md"]).stdout
    assert "| cell | verdict | tasks | speed-up [95% CI] | decided by |" in md
    assert "| llamacpp/q8_0/default | near-lossless | no change | 15.45x [8.01, 28.5] q=0.0015 faster |" in md
    shown = list(csv.DictReader(io.StringIO(CliRunner().invoke(app, ["show", run, "--format", "csv"]).stdout)))
    assert len(shown) == 5 and "ttft_ms_p50" in shown[0]
    bad = CliRunner().invoke(app, ["compare", run, "--format", "xml"])
    assert bad.exit_code == 2 and "expected one of table, csv, json, md" in bad.stderr


def test_task_table_folds_the_cells_whose_every_task_says_no_change_into_one_line():
    """36 rows of which 33 said `no change` buried the three that moved: those cells now share one line."""
    from orchestrator.judge.verdicts import judge_run
    from orchestrator.report.compact import task_compact

    tv = judge_run(ROOT / "tests" / "data" / "golden" / "runs" / "new").tasks
    assert (tv.task_verdict == "no change").all() and tv.cell_id.nunique() == 4
    t = task_compact(tv)
    assert t.row_count == 1 and t.columns[0]._cells == ["all 4 cells"]
    moved = tv.copy()
    first = moved.cell_id.iloc[0]
    moved.loc[moved.index[0], "task_verdict"] = "regressed"
    t = task_compact(moved)
    # the moved cell keeps a line per task (its unmoved task too); the three others share one
    assert t.row_count == 2 + 1 and t.columns[0]._cells[-1] == "3 other cells"
    assert (moved.cell_id == first).sum() == 2


def test_a_withheld_speed_call_keeps_the_speed_column_short_and_says_why_beside_the_verdict(monkeypatch):
    import pandas as pd

    from orchestrator.report.compact import compare_compact
    monkeypatch.setattr(console.out, "_width", 120)
    row = {"framework": "hf", "model": "tiny", "quantization": "fp32", "flags": "eager", "batch_size": 4,
           "verdict": "lossless", "verdict_reason": "", "kl_mean": 0.0, "max_abs": 0.0, "speedup": 0.48,
           "speedup_lo": 0.31, "speedup_hi": 0.78, "speed_call": "cannot judge",
           "speed_reason": "host busy during 4 of 6 repeats (baseline: 5 of 6)"}
    with console.out.capture() as cap:
        console.out.print(compare_compact(pd.DataFrame([row, {**row, "flags": "sdpa", "speed_call": "slower"}])))
    lines = cap.get().splitlines()
    assert max(map(len, lines)) <= 120
    text = " ".join(lines)
    assert "0.48x [0.31, 0.78] cannot judge" in text and "(host busy" not in text   # not in the speed column
    assert "KL 0, max_abs 0; speed: host busy during 4 of 6 repeats" in text   # after what decided the verdict
