"""What `bench` prints and writes for a stored run, byte for byte: the run dirs under
tests/data/golden/runs/ were written by `bench run tests/data/golden/matrix.yaml` (twice: new, old), and
expected/ holds what each command below gave then. A refactor must leave every byte as it was.
Regenerate on purpose only (a change of output that is meant): BENCH_GOLDEN_WRITE=1 pytest this file."""

import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from tests.helpers import ROOT

GOLDEN = ROOT / "tests" / "data" / "golden"
EXPECTED = GOLDEN / "expected"

# name -> the command's arguments, run in a folder holding copies of runs/new and runs/old
COMMANDS = {
    "show": ["show", "new"],
    "show_wide": ["show", "new", "--wide"],
    "show_csv": ["show", "new", "--format", "csv"],
    "compare": ["compare", "new"],
    "compare_wide": ["compare", "new", "--wide"],
    "compare_md": ["compare", "new", "--format", "md"],
    "compare_json": ["compare", "new", "--format", "json"],
    "compare_against": ["compare", "new", "--against", "old"],
    "compare_against_wide": ["compare", "new", "--against", "old", "--wide"],
    "gate_against_junit": ["gate", "new", "--against", "old", "--policy", "policy.yaml", "--junit", "out/gate.xml"],
    "gate_usage_error": ["gate", "new", "--policy", "policy.yaml"],   # speed rules need --against: exit 2
    "gate_against_md": ["gate", "new", "--against", "old", "--policy", "policy.yaml", "--format", "md"],
    "export_csv": ["export", "new", "--format", "csv", "-o", "out/csv", "--logprobs"],
    "export_jsonl": ["export", "new", "--format", "jsonl", "-o", "out/jsonl", "--no-logprobs"],
    "report": ["report", "new", "-o", "out/report/report.html"],
    "report_against": ["report", "new", "--against", "old", "-o", "out/against/report.html"],
    "history": ["history", "."],
    "plan": ["plan", "new", "--qps", "20", "--input-len", "16", "--output-len", "8", "--slo-ttft-p99", "500"],
}
# files a command writes, compared too (report.html embeds plotly.js and is checked by the report tests)
WRITTEN = ("out/gate.xml", "out/csv", "out/jsonl", "out/report/report.md", "out/against/report.md")


def _outputs(work: Path) -> dict[str, str]:
    shutil.copytree(GOLDEN / "runs", work, dirs_exist_ok=True)
    shutil.copy(GOLDEN / "policy.yaml", work)
    got = {}
    runner = CliRunner()
    for name, args in COMMANDS.items():
        res = runner.invoke(app, args, catch_exceptions=False)
        got[f"{name}.txt"] = f"exit {res.exit_code}\n--- stdout\n{res.stdout}--- stderr\n{res.stderr}"
    for rel in WRITTEN:
        path = work / rel
        for f in sorted(path.rglob("*") if path.is_dir() else [path]):
            if f.is_file():
                got[str(f.relative_to(work / "out")).replace("/", "__")] = f.read_text()
    return got


def test_stored_run_prints_the_same_bytes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "180")
    got = _outputs(tmp_path)
    if os.environ.get("BENCH_GOLDEN_WRITE"):
        shutil.rmtree(EXPECTED, ignore_errors=True)
        EXPECTED.mkdir()
        for name, text in got.items():
            (EXPECTED / name).write_text(text)
        pytest.skip("expected outputs written")
    want = {f.name: f.read_text() for f in EXPECTED.iterdir()}
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], f"{name} changed"
