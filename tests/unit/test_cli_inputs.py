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


BOMB = "".join(f"{a}: &{a} [{', '.join([f'*{b}'] * 9) if b else ', '.join(['1'] * 9)}]\n"
               for a, b in zip("abcdefghi", ["", *"abcdefgh"]))


def test_a_yaml_alias_bomb_fails_fast_with_its_path(tmp_path):
    """A kilobyte of aliases of aliases (9^9 values written out) is refused before validation walks it."""
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB + "models: {tiny: builtin:tiny}\naxes: {framework: [hf], model: [tiny], quantization: [fp32], "
                    "batch_size: *i, input_len: [8], output_len: [8]}\n")
    assert len(path.read_text()) < 1500
    t0 = time.perf_counter()
    res = CliRunner().invoke(app, ["validate", str(path)], env={"COLUMNS": "300"})
    assert time.perf_counter() - t0 < 2 and res.exit_code == 2, res.output
    assert "f: holds more than 100,000 values (written out, a YAML alias (*) counted at each use)" in " ".join(res.output.split())
    assert len(res.output) < 600


def test_error_messages_show_at_most_a_few_hundred_characters_of_a_value(tmp_path):
    from orchestrator.values import SHOWN_MAX, shown

    huge = [[list(range(1000))] * 100] * 100
    assert len(shown(huge)) <= SHOWN_MAX and len(shown("x" * 10**6)) <= SHOWN_MAX
    path = tmp_path / "m.yaml"   # a wrong axis value of 20,000 characters
    path.write_text("models: {tiny: builtin:tiny}\naxes: {framework: [hf], model: [tiny], quantization: [fp32], "
                    f"batch_size: [1], input_len: [8], output_len: [8], mode: ['{'z' * 20000}']}}\n")
    res = CliRunner().invoke(app, ["validate", str(path)], env={"COLUMNS": "300"})
    assert res.exit_code == 2 and "axes.mode[0]" in res.output and len(res.output) < 1500, res.output[:2000]


@pytest.mark.parametrize("name", ["../../x", "/etc/x", "a/b", "..", ".hidden", "-rf", "x" * 200, "a b", ""])
def test_a_matrix_name_is_a_safe_file_name(name):
    from tests.helpers import problems

    got = problems({"name": name, "models": {"tiny": "builtin:tiny"},
                    "axes": {"framework": ["hf"], "model": ["tiny"], "quantization": ["fp32"], "batch_size": [1],
                             "input_len": [8], "output_len": [8]}})
    assert len(got) == 1 and got[0].startswith("name: String should match pattern"), got


def test_every_shipped_matrix_name_is_still_valid():
    import yaml

    from orchestrator.matrix.validate import load_matrix

    for path in [*(ROOT / "matrices").glob("*.yaml"), ROOT / "cluster" / "gpu-sweep.yaml"]:
        if "name" in (yaml.safe_load(path.read_text()) or {}):
            load_matrix(path)


def test_validate_notes_a_choice_file_of_the_old_form(tmp_path):
    """Choices that carry the target_delimiter (the old form) still validate, and `bench validate` says how it read them."""
    items = tmp_path / "mc.jsonl"
    items.write_text('{"prompt": "The sea", "choices": [" grey", " old"], "answer_index": 0}\n')
    path = tmp_path / "m.yaml"
    path.write_text("models: {tiny: builtin:tiny}\naxes: {framework: [hf], model: [tiny], quantization: [fp32], "
                    f"batch_size: [1], input_len: [8], output_len: [8]}}\ntasks: [{{kind: choice, name: mc, path: {items}}}]\n")
    res = CliRunner().invoke(app, ["validate", str(path)], env={"COLUMNS": "300"})
    assert res.exit_code == 0, res.output
    assert "note: tasks[0]: " in res.output and "(the old form): read without it" in res.output, res.output
