"""Bad input stops a command before it reads anything, with a line that says what is wrong and what
would be valid (exit 2): run dirs that are not runs, YAML that expands without bound, names that would
put files outside their folder."""

from __future__ import annotations

import shutil
import time

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from tests.helpers import ROOT

GOLDEN = ROOT / "tests" / "data" / "golden"


@pytest.fixture
def runs(tmp_path):
    shutil.copytree(GOLDEN / "runs", tmp_path / "runs")
    shutil.copy(GOLDEN / "policy.yaml", tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "not-a-run").mkdir()
    (tmp_path / "not-a-run" / "notes.txt").write_text("x")
    return tmp_path


@pytest.mark.parametrize("args", [
    ["compare", "{new}", "--against", "{bad}"],
    ["gate", "{new}", "--against", "{bad}", "--policy", "{policy}"],
    ["report", "{new}", "--against", "{bad}"],
    ["compare", "{new}", "--against", "{old}", "--noise-run", "{bad}"],
    ["compare", "{bad}"],
    ["show", "{bad}"],
    ["plan", "{bad}", "--qps", "1", "--input-len", "8", "--output-len", "8"],
    ["export", "{bad}"],
    ["gate", "{bad}", "--policy", "{policy}"],
])
@pytest.mark.parametrize("bad", ["empty", "not-a-run"])
def test_a_folder_that_is_not_a_run_is_a_usage_error(runs, args, bad):
    where = {"new": runs / "runs" / "new", "old": runs / "runs" / "old", "bad": runs / bad, "policy": runs / "policy.yaml"}
    res = CliRunner().invoke(app, [a.format(**where) for a in args], env={"COLUMNS": "400"})
    assert res.exit_code == 2, res.output
    said = " ".join(res.output.replace("│", " ").split())    # click's error box folds the line
    assert f"{where['bad']} is not a run directory: a run dir holds manifest.json" in said, res.output


def test_a_run_against_a_run_still_compares(runs):
    res = CliRunner().invoke(app, ["compare", str(runs / "runs" / "new"), "--against", str(runs / "runs" / "old")])
    assert res.exit_code == 0, res.output
