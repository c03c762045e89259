"""The journal (orchestrator/store/journal.py): crash safety of the append-only layout, on real files.

Torn records are made by cutting a journal file at every interesting byte of its last record (what a
kill mid-write() leaves); SIGKILLing a process that writes large cells is e2e/test_store_processes.py's.
"""

import shutil

import numpy as np
import pyarrow as pa
import pytest

from orchestrator.store import journal, run_store
from orchestrator.store.compaction import compact
from orchestrator.store.run_store import RunStore
from orchestrator.store.schema import CELLS_FILE_SCHEMA, LOGPROBS_SCHEMA, SIDE_TABLES
from tests.helpers import ROOT, lp, row


def state(store: RunStore) -> dict:
    """cell_id -> (status, duration_s, logprob rows, their distinct values) through the store's readers."""
    cells = store.read_cells().set_index("cell_id")
    assert cells.index.is_unique
    lps = store.read_logprobs().to_pandas()
    assert not lps.duplicated(["cell_id", "position"]).any()
    out = {}
    for cid, c in cells.iterrows():
        mine = lps[lps.cell_id == cid]
        out[cid] = (c.status, c.duration_s, len(mine), sorted(set(mine.logprob.tolist())))
    return out


def new_process():
    """What a new driver process sees: no journal writer of this one (each process writes its own file)."""
    run_store._JOURNALS.clear()


def last_record(path):
    schemas, records = journal.scan(path)
    rec = records[-1]
    start = min(off for off, _, _ in rec.parts.values())
    return rec, start


def test_torn_last_record_is_skipped_at_every_cut(tmp_path):
    src = RunStore(tmp_path / "src")
    src.write_cell(row("c0", duration_s=1.0), lp("c0", 5, -1.0))
    src.write_cell(row("c1", duration_s=1.0), lp("c1", 4, -2.0))
    path, = journal.journal_files(src.root)
    record_start = path.stat().st_size
    src.write_cell(row("c1", duration_s=2.0), lp("c1", 7, -3.0))   # stored again: the copy the cuts tear
    full = state(src)
    assert full["c1"] == ("ok", 2.0, 7, [-3.0])
    rec, payload = last_record(path)
    lp_off, lp_len, _ = rec.parts["logprobs"]
    cell_off, cell_len, _ = rec.parts["cells"]
    assert lp_off < cell_off, "side rows before the cell row"
    size = path.stat().st_size
    cuts = {"inside the fixed header": record_start + 10, "inside the JSON header": payload - 10,
            "side rows half written": lp_off + lp_len // 2, "side rows written, no cell row yet": cell_off,
            "cell row half written": cell_off + cell_len // 2, "one byte short": size - 1}
    before = {"c0": full["c0"], "c1": ("ok", 1.0, 4, [-2.0])}   # the torn copy is not read: the older one is
    for what, cut in cuts.items():
        run = tmp_path / f"cut-{cut}"
        shutil.copytree(src.root, run)
        jf, = journal.journal_files(run)
        with open(jf, "r+b") as f:
            f.truncate(cut)
        store = RunStore(run)
        assert state(store) == before, what
        assert store.stored_status() == {"c0": "ok", "c1": "ok"}, what
        # a new driver resumes: its records go to a new file, and every copy reads as written
        new_process()
        store.write_cell(row("c2", duration_s=5.0), lp("c2", 3, -5.0))
        assert len(journal.journal_files(run)) == 2
        assert state(store) == before | {"c2": ("ok", 5.0, 3, [-5.0])}, what
        compact(store)
        assert state(store) == before | {"c2": ("ok", 5.0, 3, [-5.0])}, what
        assert journal.journal_files(run) == [], "folded journals are deleted"
    # the writer that saw its file change (not by its own hand) never appends after a torn record
    new_process()
    store = RunStore(tmp_path / "same")
    store.write_cell(row("a", duration_s=1.0), lp("a", 2, -1.0))
    jf, = journal.journal_files(store.root)
    with open(jf, "ab") as f:
        f.write(b"LBJR\x00")   # a torn record
    store.write_cell(row("b", duration_s=1.0), lp("b", 2, -1.0))
    assert set(state(store)) == {"a", "b"} and len(journal.journal_files(store.root)) == 2


def test_a_damaged_record_is_an_error_not_silently_other_rows(tmp_path):
    store = RunStore(tmp_path / "run")
    for i in range(3):
        store.write_cell(row(f"c{i}"), lp(f"c{i}", 4, -float(i)))
    path, = journal.journal_files(store.root)
    _, records = journal.scan(path)
    off, n, _ = records[1].parts["logprobs"]
    data = bytearray(path.read_bytes())
    data[off + n // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match="damaged"):
        store.read_logprobs()


def test_the_newest_copy_wins_across_journal_per_cell_files_and_compacted(tmp_path):
    """A run dir written by an earlier version (per-cell files), compacted, then resumed by this one."""
    store = RunStore(tmp_path / "run")
    store.write_cell_files(row("x", duration_s=1.0), lp("x", 3, -1.0))
    store.write_cell_files(row("y", duration_s=1.0), lp("y", 3, -1.0))
    compact(store)
    store.write_cell_files(row("x", duration_s=2.0), lp("x", 4, -2.0))    # per-cell over compacted
    store.write_cell_files(row("y", duration_s=2.0), lp("y", 4, -2.0))
    assert state(store)["x"] == ("ok", 2.0, 4, [-2.0])
    store.write_cell(row("y", duration_s=3.0), lp("y", 5, -3.0))          # journal over per-cell
    store.write_cell(row("z", "vllm", "failed", duration_s=3.0))
    want = {"x": ("ok", 2.0, 4, [-2.0]), "y": ("ok", 3.0, 5, [-3.0]), "z": ("failed", 3.0, 0, [])}
    assert state(store) == want
    assert store.logprob_files()["y"].suffix == journal.SUFFIX and "z" not in store.logprob_files()
    store.write_cell(row("y", "hf", "failed", duration_s=4.0))             # stored again without rows: none
    want["y"] = ("failed", 4.0, 0, [])
    assert state(store) == want
    compact(store)
    assert state(store) == want
    assert sorted(str(p.relative_to(store.root)) for p in store.root.rglob("*.parquet")) == [
        "cells/framework=hf/compacted-2.parquet", "cells/framework=vllm/compacted-2.parquet",
        "logprobs/framework=hf/compacted-2.parquet"]
    assert journal.journal_files(store.root) == []
    # the same process goes on writing after the compaction deleted its file: a new file
    store.write_cell(row("w", duration_s=5.0), lp("w", 2, -5.0))
    assert state(store)["w"] == ("ok", 5.0, 2, [-5.0]) and len(journal.journal_files(store.root)) == 1


def test_a_journal_from_before_the_schema_grew_reads_with_nulls(tmp_path):
    root = tmp_path / "run"
    old_cells = CELLS_FILE_SCHEMA.remove(CELLS_FILE_SCHEMA.get_field_index("duration_s"))
    old_lp = LOGPROBS_SCHEMA.remove(LOGPROBS_SCHEMA.get_field_index("topk_logprobs"))
    w = journal.JournalWriter(root, {"cells": old_cells, "logprobs": old_lp,
                                     **{n: t.schema for n, t in SIDE_TABLES.items() if n != "logprobs"}})
    w.append("old", "hf", [("logprobs", lp("old", 3, -1.0).drop_columns(["topk_logprobs"]).to_batches()[0]),
                           ("cells", pa.Table.from_pylist([row("old")], schema=old_cells).to_batches()[0])])
    store = RunStore(root)
    store.write_cell(row("new", duration_s=1.0), lp("new", 2, -2.0))
    cells = store.read_cells().set_index("cell_id")
    assert np.isnan(cells.loc["old", "duration_s"]) and cells.loc["new", "duration_s"] == 1.0
    got = store.read_logprobs().to_pandas().set_index("cell_id")
    assert got.loc["old", "topk_logprobs"].isna().all() and len(got.loc["old"]) == 3
    compact(store)
    assert store.read_cells().set_index("cell_id").loc["new", "duration_s"] == 1.0
    assert len(store.read_logprobs()) == 5


@pytest.mark.parametrize("version, suffix", [(1, ".journal"), (2, ".journal2")])
def test_an_earlier_version_journal_still_reads_and_compacts(tmp_path, version, suffix):
    """tests/data/journal_v1 and journal_v2: written by versions 1 (lz4 inside the messages, no rows
    records) and 2 (a rows record after b); a, b, a stored again, c failed; beside a file of this writer."""
    run = tmp_path / "run"
    (run / journal.JOURNAL_DIR).mkdir(parents=True)
    old, = (ROOT / "tests" / "data" / f"journal_v{version}").glob(f"*{suffix}")
    assert old.read_bytes().startswith(f"lossless-bench journal {version}\n".encode()) and old.name.endswith(suffix)
    shutil.copy(old, run / journal.JOURNAL_DIR / old.name)
    store = RunStore(run)
    want = {"a": ("ok", 2.0, 5, [-3.0]), "b": ("ok", 1.0, 4, [-2.0]), "c": ("failed", 1.0, 0, [])}
    assert state(store) == want
    new_process()
    store.write_cell(row("b", duration_s=3.0), lp("b", 2, -4.0))   # newer, in a file of this version
    want["b"] = ("ok", 3.0, 2, [-4.0])
    assert [p.suffix for p in journal.journal_files(run)] == [suffix, journal.SUFFIX]
    assert state(store) == want
    compact(store)
    assert state(store) == want and journal.journal_files(run) == []


def test_rows_records_read_as_the_cells_own_rows_and_a_torn_one_is_skipped(tmp_path, monkeypatch):
    """Every CELLS_BATCH cell records the writer repeats their cells rows in one rows record; readers
    take the rows from there. A cell stored again after its rows record still wins, a torn rows record
    (the tail a kill leaves) is skipped, and a damaged one is an error."""
    monkeypatch.setattr(journal, "CELLS_BATCH", 2)
    store = RunStore(tmp_path / "src")
    for i, cid in enumerate(["c0", "c1", "c2", "c1", "c3"]):   # rows records after the 2nd and 4th
        store.write_cell(row(cid, duration_s=float(i)), lp(cid, 2 + i, -float(i)))
    want = {"c0": ("ok", 0.0, 2, [-0.0]), "c1": ("ok", 3.0, 5, [-3.0]), "c2": ("ok", 2.0, 4, [-2.0]),
            "c3": ("ok", 4.0, 6, [-4.0])}
    assert state(store) == want
    path, = journal.journal_files(store.root)
    _, records = journal.scan(path)
    assert [r.row_at is not None for r in records] == [True, True, True, True, False]
    # a torn last record that is a rows record: its cells read from their own records
    store.write_cell(row("c4", duration_s=9.0), lp("c4", 1, -9.0))   # completes a third rows record (c3, c4)
    _, records = journal.scan(path)
    assert records[-1].row_at is not None
    rows_part, _ = records[-1].row_at
    for cut in (rows_part[0] - 1, rows_part[0] + rows_part[1] // 2, rows_part[0] + rows_part[1] - 1):
        run = tmp_path / f"cut-{cut}"
        shutil.copytree(store.root, run)
        jf, = journal.journal_files(run)
        with open(jf, "r+b") as f:
            f.truncate(cut)
        _, recs = journal.scan(jf)
        assert [r.cell_id for r in recs] == ["c0", "c1", "c2", "c1", "c3", "c4"]
        assert recs[-1].row_at is None and recs[-2].row_at is None
        assert state(RunStore(run)) == want | {"c4": ("ok", 9.0, 1, [-9.0])}
    # a damaged rows record inside the file (not a tail): an error, never other rows (this also
    # shows the readers take the rows from there)
    data = bytearray(path.read_bytes())
    first_rows = records[0].row_at[0]
    data[first_rows[0] + first_rows[1] // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match="damaged"):
        store.read_cells()
