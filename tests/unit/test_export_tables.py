"""`bench export` writes every table of a run: cells, tasks and samples as stored (logprobs on request),
and the verdicts bench compare computes: per cell, per cell and task, per cell's samples."""

import csv
import json
import shutil

from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.store.run_store import RunStore
from tests.helpers import ROOT

RUN = ROOT / "tests" / "data" / "golden" / "runs" / "new"


def _csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_export_writes_every_table_and_the_verdicts(tmp_path):
    shutil.copytree(RUN, tmp_path / "new")
    run, out = tmp_path / "new", tmp_path / "csv"
    res = CliRunner().invoke(app, ["export", str(run), "-o", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    names = sorted(p.name for p in out.iterdir())
    assert names == ["cells.csv", "samples.csv", "sampling_verdicts.csv", "task_verdicts.csv", "tasks.csv",
                     "verdicts.csv"]   # no logprobs unless asked
    store = RunStore(run)
    assert len(_csv(out / "tasks.csv")) == store.read_tasks().num_rows == 888
    samples = _csv(out / "samples.csv")
    assert len(samples) == store.read_samples().num_rows and len(json.loads(samples[0]["token_ids"])) == 8
    verdicts = {(r["framework"], r["quantization"], r["flags"]): r for r in _csv(out / "verdicts.csv")}
    assert verdicts["llamacpp", "q8_0", "default"]["verdict"] == "near-lossless"
    assert verdicts["llamacpp", "fp8", "default"]["verdict"] == "n/a" and verdicts["hf", "fp32", "default"]["kl_mean"] == "0.0"
    tasks = _csv(out / "task_verdicts.csv")
    assert len(tasks) == 8 and {r["task_verdict"] for r in tasks} == {"no change"} and tasks[0]["n"] == "111"
    sampling = _csv(out / "sampling_verdicts.csv")
    assert sorted(r["sampling_verdict"] for r in sampling) == ["identical"] + ["not distinguishable"] * 3

    jl = tmp_path / "jsonl"
    res = CliRunner().invoke(app, ["export", str(run), "--format", "jsonl", "-o", str(jl), "--logprobs"])
    assert res.exit_code == 0, res.output
    lines = (jl / "logprobs.jsonl").read_text().splitlines()
    assert len(lines) == store.read_logprobs().num_rows > 0
    rows = [json.loads(x) for x in (jl / "verdicts.jsonl").read_text().splitlines()]
    assert next(r for r in rows if r["quantization"] == "fp8")["kl_mean"] is None   # not measured: null
