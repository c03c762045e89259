"""One judge (orchestrator/judge/verdicts.py: judge_run): `bench compare`, `bench report` and `bench export` show the
same verdicts on every layer, within a run and against a stored one. Read from the golden stored runs."""

import json
import shutil

from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.judge.verdicts import judge_run
from orchestrator.report.data import load, load_against
from tests.helpers import ROOT

RUNS = ROOT / "tests" / "data" / "golden" / "runs"
LAYERS = ("verdict", "task_verdict", "sampling_verdict")


def _words(rows, keys=LAYERS) -> dict:
    return {r["cell_id"]: tuple(r.get(k) if isinstance(r.get(k), str) else None for k in keys) for r in rows}


def _compare_json(*args) -> dict:
    res = CliRunner().invoke(app, ["compare", *map(str, args), "--format", "json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_report_against_and_compare_against_give_the_same_verdicts(tmp_path):
    shutil.copytree(RUNS, tmp_path, dirs_exist_ok=True)
    new, old = tmp_path / "new", tmp_path / "old"
    compared = _compare_json(new, "--against", old)
    new_df, *_ = load(new)
    report = load_against(new_df, new, old)
    pairs = report.pairs[report.pairs.only_in.isna()].to_dict("records")
    assert pairs and any(isinstance(r.get("sampling_verdict"), str) for r in pairs), "the golden runs have samples"
    want = _words(r for r in compared["cells"] if r.get("only_in") is None)
    assert _words(pairs) == want
    # and the task layer item for item: same verdict per (cell, task)
    got_tasks = {(r["cell_id"], r["task"]): r["task_verdict"] for r in report.tasks.table.to_dict("records")}
    assert got_tasks == {(r["cell_id"], r["task"]): r["task_verdict"] for r in compared["tasks"]}


def test_report_compare_and_export_judge_a_run_alike(tmp_path):
    shutil.copytree(RUNS / "new", tmp_path / "new")
    run = tmp_path / "new"
    v = judge_run(run)
    compared = _compare_json(run)
    df, _, error, tasks, (sampling, sampling_error) = load(run)
    assert error is None and sampling_error is None
    assert _words(compared["cells"]) == _words(v.cells.to_dict("records")) == _words(df.to_dict("records"))
    assert _words(sampling.to_dict("records"), ("sampling_verdict",)) == _words(
        compared["sampling"], ("sampling_verdict",))
    res = CliRunner().invoke(app, ["export", str(run), "--format", "jsonl", "-o", str(tmp_path / "x"), "--no-logprobs"])
    assert res.exit_code == 0, res.output
    exported = [json.loads(x) for x in (tmp_path / "x" / "verdicts.jsonl").read_text().splitlines()]
    assert _words(exported) == _words(compared["cells"])


def _conforms(frame, schema) -> None:
    """Every declared column present in `frame` converts to its declared type (nulls allowed)."""
    import pyarrow as pa

    for field in schema:
        if field.name in frame:
            values = [None if (v is None or (isinstance(v, float) and v != v)) else v for v in frame[field.name]]
            pa.array(values, type=field.type)   # raises where a value is not of the declared type


def test_every_table_judge_run_returns_has_one_declared_schema(tmp_path):
    from orchestrator.judge import verdicts as vs

    shutil.copytree(RUNS, tmp_path, dirs_exist_ok=True)
    within = judge_run(tmp_path / "new")
    across = judge_run(tmp_path / "new", against=tmp_path / "old")
    assert vs.undeclared(within.cells, vs.CELL_VERDICT_COLUMNS) == []
    assert vs.undeclared(across.cells, vs.CELL_VERDICT_COLUMNS, vs.PAIR_VERDICT_COLUMNS) == []
    for v in (within, across):
        assert vs.undeclared(v.tasks, vs.TASK_VERDICT_COLUMNS) == []
        assert vs.undeclared(v.sampling, vs.SAMPLING_VERDICT_COLUMNS) == []
        _conforms(v.cells, vs.CELL_VERDICT_COLUMNS)
        _conforms(v.tasks, vs.TASK_VERDICT_COLUMNS)
        _conforms(v.sampling, vs.SAMPLING_VERDICT_COLUMNS)
    _conforms(across.cells, vs.PAIR_VERDICT_COLUMNS)
    # and the check has teeth: an undeclared column is named
    assert vs.undeclared(within.cells.assign(made_up=1), vs.CELL_VERDICT_COLUMNS) == ["made_up"]
