"""Compaction: per-cell files folded into a few large ones, atomically, on real Parquet (no mocks).

The kills are simulated by raising KeyboardInterrupt (what SIGINT raises, and like a kill it
runs no `except Exception` cleanup) between the steps of a compaction. (One writer at a time, against
another process holding the run: e2e/test_store_processes.py.)
"""

import importlib.util
import json
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.execution.runner import cells_to_run
from orchestrator.judge.analysis import analyse
from orchestrator.matrix.cells import expand
from orchestrator.matrix.validate import parse_matrix
from orchestrator.store import compaction, journal
from orchestrator.store.compaction import compact
from orchestrator.store.layout import COMMIT_FILE
from orchestrator.store.run_store import RunStore
from orchestrator.store.schema import LOGPROBS_SCHEMA
from tests.helpers import ROOT, lp, row, small_store


def _scale_module():
    spec = importlib.util.spec_from_file_location("analysis_at_scale", ROOT / "benchmarks" / "analysis_at_scale.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("analysis_at_scale", module)
    spec.loader.exec_module(module)
    return module


def parquet_files(store: RunStore) -> list[str]:
    return sorted(str(p.relative_to(store.root)) for p in store.root.rglob("*.parquet"))


def exact(store: RunStore) -> tuple[dict, dict]:
    """(cell_id -> status, cell_id -> logprob rows) through the store's readers; asserts no duplicates."""
    cells = store.read_cells()
    assert cells.cell_id.is_unique
    lps = store.read_logprobs().to_pandas()
    assert not lps.duplicated(["cell_id", "kind", "repeat", "prompt_index", "position"]).any()
    return dict(zip(cells.cell_id, cells.status)), lps.groupby("cell_id").size().to_dict()


def raw(store: RunStore) -> tuple[pd.DataFrame, pd.DataFrame]:
    """What plain pandas reads from the run dir (no store logic)."""
    return pd.read_parquet(store.root / "cells"), pd.read_parquet(store.root / "logprobs")


def test_compaction_folds_every_cell_into_one_file_per_framework(tmp_path):
    store = small_store(tmp_path)
    before = exact(store)
    stats = compact(store)
    assert stats["cells_folded"] == 6 and stats["generation"] == 1
    assert parquet_files(store) == ["cells/framework=hf/compacted-1.parquet", "cells/framework=vllm/compacted-1.parquet",
                                    "logprobs/framework=hf/compacted-1.parquet",
                                    "logprobs/framework=vllm/compacted-1.parquet"]
    assert exact(store) == before
    cells, lps = raw(store)  # plain pandas: one row per cell, each logprob row once, hive framework column
    assert sorted(cells.cell_id) == [f"c{i}" for i in range(6)] and set(cells.framework) == {"hf", "vllm"}
    assert len(lps) == sum(before[1].values()) and not lps.duplicated(["cell_id", "position"]).any()
    # logprobs sorted by cell_id inside each file, and the commit record knows which cell is where
    record = json.loads((store.root / COMMIT_FILE).read_text())
    for rel, info in record["logprobs"].items():
        t = pq.read_table(store.root / rel)
        assert t["cell_id"].to_pylist() == sorted(t["cell_id"].to_pylist())
        assert info["cells"] == sorted(set(t["cell_id"].to_pylist()))
        assert info["rows"] == [before[1][c] for c in info["cells"]]
    # the values read back bit for bit
    got = store.read_logprobs().to_pandas().set_index(["cell_id", "position"]).sort_index()
    assert (got.logprob.to_numpy() == np.concatenate([np.full(4 + i, -float(i), np.float32)
                                                     for i in range(6) if i != 3])).all()
    mtimes = {p: p.stat().st_mtime_ns for p in store.root.rglob("*.parquet")}
    assert compact(store)["cells_folded"] == 0  # nothing new: no file is rewritten
    assert {p: p.stat().st_mtime_ns for p in store.root.rglob("*.parquet")} == mtimes


def test_compaction_then_resume_skips_stored_cells(tmp_path, write_matrix):
    data = {"name": "m", "models": {"tiny": "builtin:tiny"},
            "axes": {"framework": ["hf"], "model": ["tiny"], "quantization": ["fp32", "q4_0"], "batch_size": [1, 2, 4]}}
    cells = expand(parse_matrix(data))
    store = RunStore(tmp_path / "run")
    for c in cells[:4]:
        status = "unsupported" if c.quantization == "q4_0" else "ok"
        store.write_cell(row(c.cell_id, status=status, batch_size=c.batch_size, quantization=c.quantization),
                         lp(c.cell_id) if status == "ok" else None)
    compact(store)
    assert not [p for p in store.root.rglob("*.parquet") if not p.name.startswith("compacted-")]
    todo = cells_to_run(cells, store, rerun_failed=False)
    assert [c.cell_id for c in todo] == [c.cell_id for c in cells[4:]]
    again = cells_to_run(cells, store, rerun_failed=True)
    assert {c.cell_id for c in again} == {c.cell_id for c in cells[4:]} | {
        c.cell_id for c in cells[:4] if c.quantization == "q4_0"}


def test_rerun_after_compaction_leaves_one_row_per_cell_the_new_one(tmp_path):
    store = small_store(tmp_path)
    compact(store)
    # --rerun-failed: c3 now runs ok with logprobs; c1 (ok before, with logprobs) is stored again failed
    store.write_cell(row("c3", "hf", "ok", duration_s=2.0), lp("c3", 9, -7.0))
    store.write_cell(row("c1", "hf", "failed", reason="second try"), None)
    status, rows = exact(store)  # before the next compaction: the store's readers pick the new rows
    assert status == {"c0": "ok", "c1": "failed", "c2": "ok", "c3": "ok", "c4": "ok", "c5": "ok"}
    assert rows == {"c0": 4, "c2": 6, "c3": 9, "c4": 8, "c5": 9}
    assert store.read_cells().set_index("cell_id").loc["c3", "duration_s"] == 2.0
    files = store.logprob_files()
    assert files["c3"].suffix == journal.SUFFIX and "c1" not in files
    compact(store)
    assert exact(store) == (status, rows)
    cells, lps = raw(store)
    assert cells.cell_id.is_unique and len(cells) == 6
    assert cells.set_index("cell_id").loc["c1", "reason"] == "second try"
    assert lps.groupby("cell_id").size().to_dict() == rows
    assert (lps[lps.cell_id == "c3"].logprob == np.float32(-7.0)).all()
    # the untouched framework kept its compacted files; hf got generation 2
    assert parquet_files(store) == ["cells/framework=hf/compacted-2.parquet", "cells/framework=vllm/compacted-1.parquet",
                                    "logprobs/framework=hf/compacted-2.parquet",
                                    "logprobs/framework=vllm/compacted-1.parquet"]


def _raise_on_call(n: int, original):
    calls = {"n": 0}

    def wrapped(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt("killed")
        return original(*args, **kwargs)
    return wrapped


KILLS = {
    "while writing logprobs": lambda mp: mp.setattr(compaction._Writer, "add", _raise_on_call(2, compaction._Writer.add)),
    "before the commit": lambda mp: mp.setattr(compaction, "_commit", _raise_on_call(1, compaction._commit)),
    "after the commit": lambda mp: mp.setattr(compaction, "_finish", _raise_on_call(1, compaction._finish)),
    # os.replace: 1 is the commit record's own atomic write, 2 the first rename, 3 the second
    "between two renames": lambda mp: mp.setattr(compaction.os, "replace", _raise_on_call(3, compaction.os.replace)),
}


@pytest.mark.parametrize("when", list(KILLS))
@pytest.mark.parametrize("generation", [1, 2])
def test_kill_mid_compaction_leaves_a_readable_duplicate_free_run(tmp_path, monkeypatch, when, generation):
    store = small_store(tmp_path)
    if generation == 2:  # a second compaction, over compacted files and cells stored again since
        compact(store)
        store.write_cell(row("c3", "hf", "ok"), lp("c3", 5, -3.5))
        store.write_cell(row("c6", "vllm", "ok"), lp("c6", 3, -6.0))
    expected = exact(store)
    with monkeypatch.context() as mp:
        KILLS[when](mp)
        with pytest.raises(KeyboardInterrupt):
            compact(store)
    assert exact(store) == expected  # the bench commands read it whole, once per cell
    assert store.stored_status() == expected[0]
    df = analyse(store.root)
    assert df.cell_id.is_unique and set(df.cell_id) == set(expected[0])
    # the next writer (bench run resuming, or bench compact) finishes or undoes it
    compaction.remove_partial_writes(store)
    assert exact(store) == expected
    compact(store)
    assert exact(store) == expected
    cells, lps = raw(store)  # and plain pandas reads it exactly too
    assert cells.cell_id.is_unique and set(cells.cell_id) == set(expected[0])
    assert lps.groupby("cell_id").size().to_dict() == expected[1]
    assert not list(store.root.rglob(".compacting-*")) and not list(store.root.rglob(".tmp-*"))
    names = [p.name for p in store.root.rglob("*.parquet")]
    assert all(n.startswith("compacted-") for n in names) and len(names) == 4


def test_analysis_is_identical_before_and_after_compaction(tmp_path):
    scale = _scale_module()
    store = RunStore(tmp_path / "run")
    info = scale.generate(store.root, 600, 120_000, seed=3)
    assert info["cells"] == 600 and info["ok"] > 400
    before = analyse(store.root)
    assert set(before.verdict) >= {"identical", "lossless", "near-lossless", "lossy", "n/a"}
    assert before.speedup.notna().sum() > 400 and before.noise_kl_mean.notna().any()
    compact(store)
    after = analyse(store.root)
    # equal to the last bits but for DuckDB's parallel sums, whose order varies from run to run
    pd.testing.assert_frame_equal(before, after, check_exact=False, rtol=1e-12, atol=0)
    # cells stored again after the compaction take part with their new rows
    victim = before[(before.verdict == "lossy")].iloc[0]
    base = before[before.cell_id == victim.baseline_cell_id].iloc[0]
    copy = store.read_logprobs().to_pandas()
    copy = pa.Table.from_pandas(copy[copy.cell_id == base.cell_id].assign(cell_id=victim.cell_id),
                                schema=LOGPROBS_SCHEMA, preserve_index=False)
    stored = store.read_cells().set_index("cell_id").loc[victim.cell_id].to_dict()
    store.write_cell({k: v for k, v in stored.items() if not (isinstance(v, float) and np.isnan(v))}
                     | {"cell_id": victim.cell_id}, copy)
    redone = analyse(store.root).set_index("cell_id")
    assert redone.loc[victim.cell_id, "verdict"] == "identical"
    compact(store)
    pd.testing.assert_frame_equal(analyse(store.root).set_index("cell_id"), redone, check_exact=False, rtol=1e-12,
                                  atol=0)


def test_readers_of_a_compacted_run_with_new_cells(tmp_path):
    """ls, show, export and plan read a compacted run to which per-cell files were added."""
    store = small_store(tmp_path)
    store.write_manifest({"matrix": {"name": "m"}, "cells": [{"cell_id": f"c{i}"} for i in range(7)]})
    compact(store)
    store.write_cell(row("c3", "hf", "ok"), lp("c3", 5))
    store.write_cell(row("c6", "vllm", "ok"), lp("c6", 3))
    runner = CliRunner()
    res = runner.invoke(app, ["ls", str(store.root)])
    assert res.exit_code == 0 and "7/7" in res.output, res.output
    res = runner.invoke(app, ["show", str(store.root)])
    assert res.exit_code == 0 and "7 cells, 7 ok" in " ".join(res.output.split()), res.output
    res = runner.invoke(app, ["export", str(store.root), "--format", "jsonl", "-o", str(tmp_path / "x"), "--logprobs"])
    assert res.exit_code == 0, res.output
    cells = [json.loads(x) for x in (tmp_path / "x" / "cells.jsonl").read_text().splitlines()]
    assert sorted(c["cell_id"] for c in cells) == [f"c{i}" for i in range(7)]
    assert {c["cell_id"]: c["status"] for c in cells}["c3"] == "ok"
    lps = [json.loads(x) for x in (tmp_path / "x" / "logprobs.jsonl").read_text().splitlines()]
    assert pd.Series([x["cell_id"] for x in lps]).value_counts().to_dict() == exact(store)[1]
    from orchestrator.capacity.plan import plan

    assert set(plan(store.root, 1.0, 8, 4).framework) == {"hf", "vllm"}


def test_compacted_files_without_their_record_are_never_guessed_at_or_removed(tmp_path):
    store = small_store(tmp_path)
    compact(store)
    (store.root / COMMIT_FILE).unlink()   # e.g. a copy that left it behind
    files = parquet_files(store)
    with pytest.raises(RuntimeError, match="compacted.json: damaged: missing, and the run dir has compacted files"):
        store.read_cells()
    with pytest.raises(RuntimeError, match="compacted.json: damaged: missing"):
        compact(store)
    store_files_after = parquet_files(store)
    assert store_files_after == files  # nothing removed, nothing written over


@pytest.mark.parametrize("legacy", [False, True], ids=["journal", "per-cell files"])
def test_every_side_table_is_folded_like_logprobs(tmp_path, monkeypatch, legacy):
    """A side table is one entry of store.SIDE_TABLES: compaction, recovery and the readers take it."""
    from orchestrator.store import schema as store_schema

    schema = pa.schema([("run_id", pa.string()), ("cell_id", pa.string()), ("task", pa.string()), ("score", pa.float64())])
    monkeypatch.setitem(store_schema.SIDE_TABLES, "tasks", store_schema.SideTable(schema, {"compression": "zstd"}))
    store = small_store(tmp_path, legacy)
    tasks = {f"c{i}": i + 1 for i in (0, 1, 4)}   # c2, c3, c5: no task rows
    for cid, n in tasks.items():
        i = int(cid[1])
        fw = "hf" if i % 2 else "vllm"
        t = pa.table({"run_id": ["r"] * n, "cell_id": [cid] * n, "task": [f"t{j}" for j in range(n)],
                      "score": [float(j) for j in range(n)]}, schema=schema)
        (store.write_cell_files if legacy else store.write_cell)(row(cid, fw, "ok"), lp(cid, 4 + i, -float(i)), t)
    before = exact(store)
    compact(store)
    assert exact(store) == before
    assert [p for p in parquet_files(store) if p.startswith("tasks/")] == [
        "tasks/framework=hf/compacted-1.parquet", "tasks/framework=vllm/compacted-1.parquet"]
    record = json.loads((store.root / COMMIT_FILE).read_text())
    assert {c: n for info in record["tasks"].values() for c, n in zip(info["cells"], info["rows"])} == tasks
    lay = store.layout()
    assert sorted(lay.side_files("tasks")) == sorted(tasks)
    got = pa.Table.from_batches(list(lay.side_batches("tasks"))).to_pandas()
    assert got.groupby("cell_id").size().to_dict() == tasks
    # stored again: the new rows win until the next compaction, which folds them
    again = pa.table({"run_id": ["r"], "cell_id": ["c1"], "task": ["again"], "score": [9.0]}, schema=schema)
    (store.write_cell_files if legacy else store.write_cell)(row("c1", "hf", "ok"), lp("c1", 3), again)
    got = pa.Table.from_batches(list(store.layout().side_batches("tasks"))).to_pandas()
    assert got.groupby("cell_id").size().to_dict() == tasks | {"c1": 1}
    compact(store)
    got = pa.Table.from_batches(list(store.layout().side_batches("tasks"))).to_pandas()
    assert got.groupby("cell_id").size().to_dict() == tasks | {"c1": 1}
    assert got.set_index("cell_id").loc["c1", "task"] == "again"


def test_compaction_reads_in_many_chunks_in_order(tmp_path, monkeypatch):
    """Several scans at once, a small window: every cell once, in the recorded order, a second time too."""
    from orchestrator.store import bulk_parquet

    monkeypatch.setattr(bulk_parquet, "SCAN_FILES", 2)
    monkeypatch.setattr(bulk_parquet, "READ_AHEAD", 3)
    store = RunStore(tmp_path / "run")
    for i in range(40):
        store.write_cell(row(f"c{i:02d}", "hf", "failed" if i % 7 == 3 else "ok"),
                         None if i % 7 == 3 else lp(f"c{i:02d}", 1 + i % 5, -float(i)))
    expected = exact(store)
    compact(store)
    for i in range(0, 40, 3):   # stored again, then merged with the compacted rows
        store.write_cell(row(f"c{i:02d}", "hf", "ok"), lp(f"c{i:02d}", 2, -100.0 - i))
    expected = exact(store)
    compact(store)
    assert exact(store) == expected
    info = next(iter(json.loads((store.root / COMMIT_FILE).read_text())["logprobs"].values()))
    t = pq.read_table(store.root / next(iter(json.loads((store.root / COMMIT_FILE).read_text())["logprobs"])))
    runs = pc.run_end_encode(t["cell_id"].combine_chunks())
    assert runs.values.to_pylist() == info["cells"] and np.diff([0, *runs.run_ends.to_pylist()]).tolist() == info["rows"]


def test_per_cell_files_from_before_the_schema_grew_are_folded_with_nulls(tmp_path):
    store = small_store(tmp_path, legacy=True)
    old = store.cell_path("hf", "c1")
    t = pq.read_table(old)
    pq.write_table(t.drop_columns(["duration_s", "notes"]), old)   # written by an older version
    compact(store)
    cells = store.read_cells().set_index("cell_id")
    assert len(cells) == 6 and cells.loc["c1", "status"] == "ok"
    assert pd.isna(cells.loc["c1", "duration_s"]) and pd.isna(cells.loc["c1", "notes"])
