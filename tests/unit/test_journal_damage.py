"""A journal damaged in the middle (orchestrator/store/journal.py, compaction.py, salvage.py): every byte
of a middle record's header and payload flipped in turn. Each read either fails naming the file and the
byte, or returns exactly what was stored; compaction never folds (so never deletes) a journal that does
not verify whole; `bench compact --salvage` keeps every other record and says what it could not keep.
A torn tail (what a killed writer leaves) is test_journal.py's.
"""

import re
import shutil

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.store import journal, run_store
from orchestrator.store.compaction import compact
from orchestrator.store.journal import DamagedJournal
from orchestrator.store.run_store import RunStore
from orchestrator.store.salvage import salvage
from orchestrator.store.schema import CELLS_FILE_SCHEMA, SIDE_TABLES
from tests.helpers import ROOT, lp, row

# a narrow cells schema (a journal written before the schema grew reads with nulls): records of ~700 bytes
SMALL_CELLS = pa.schema([CELLS_FILE_SCHEMA.field(c) for c in ("run_id", "cell_id", "model", "status", "duration_s")])
IDS = ["c0", "c1", "c2", "c3"]


def stored(store: RunStore) -> dict:
    """cell_id -> (status, duration_s, its logprobs) through the store's readers."""
    cells = store.read_cells_table(["cell_id", "status", "duration_s"]).to_pylist()
    lps = store.read_logprobs(["cell_id", "position", "logprob"]).to_pylist()
    assert len({c["cell_id"] for c in cells}) == len(cells)
    return {c["cell_id"]: (c["status"], c["duration_s"],
                           sorted((x["position"], x["logprob"]) for x in lps if x["cell_id"] == c["cell_id"]))
            for c in cells}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A run dir whose journal holds c0..c3 (with logprobs), and c1's record: (start, end) in the file."""
    root = tmp_path_factory.mktemp("src") / "run"
    w = journal.JournalWriter(root, {"cells": SMALL_CELLS, **{n: t.schema for n, t in SIDE_TABLES.items()}})
    for i, cid in enumerate(IDS):
        cells = pa.Table.from_pylist([row(cid, duration_s=float(i))], schema=SMALL_CELLS).to_batches()[0]
        w.append(cid, "hf", [("logprobs", lp(cid, 2 + i, -float(i)).to_batches()[0]), ("cells", cells)])
    path, = journal.journal_files(root)
    _, records = journal.scan(path)
    assert [r.cell_id for r in records] == IDS
    want = stored(RunStore(root))
    assert want["c1"] == ("ok", 1.0, [(1, -1.0), (2, -1.0), (3, -1.0)])
    return root, path.name, (records[1].at, records[2].at), want


def damaged(tmp_path, source, at: int) -> tuple[RunStore, bytes]:
    root, name, _, _ = source
    run = tmp_path / f"at-{at}"
    shutil.copytree(root, run)
    path = run / "journal" / name
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    run_store._JOURNALS.clear()
    return RunStore(run), bytes(data)


def names_the_place(e: DamagedJournal, name: str, start: int, end: int) -> bool:
    text = str(e)
    at = int(re.search(r"damaged at byte (\d+)", text).group(1))
    return name in text and start <= at < end and "bench compact --salvage" in text


def test_every_byte_of_a_middle_record_damaged_is_an_error_or_the_stored_rows(tmp_path, source):
    root, name, (start, end), want = source
    errors = 0
    for at in range(start, end):
        store, data = damaged(tmp_path, source, at)
        try:
            got = stored(store)
        except DamagedJournal as e:
            assert names_the_place(e, name, start, end), (at, str(e))
            errors += 1
            if e.cells_after is not None:   # a header that does not verify: the cells after it are named
                assert e.cells_after == ["c2", "c3"], (at, str(e))
        else:
            assert got == want, at   # never fewer cells, never other rows
        # compaction never folds a journal that does not verify whole: it fails, and nothing changed
        with pytest.raises(DamagedJournal) as info:
            compact(store)
        assert names_the_place(info.value, name, start, end), at
        assert (store.root / "journal" / name).read_bytes() == data, at
        assert not list(store.root.rglob("*.parquet")) and not (store.root / "compacted.json").exists(), at
        shutil.rmtree(store.root)
    assert errors == end - start, "every byte of the record is under a checksum that a read of the record checks"


def test_salvage_keeps_every_record_that_verifies_and_says_what_it_could_not(tmp_path, source):
    root, name, (start, end), want = source
    header_end = min(off for off, _, _ in journal.scan(root / "journal" / name)[1][1].parts.values())
    # every byte of the fixed and JSON header, and the first, middle and last byte of each part
    parts = journal.scan(root / "journal" / name)[1][1].parts
    cuts = set(range(start, header_end)) | {o + d for o, n, _ in parts.values() for d in (0, n // 2, n - 1)}
    for at in sorted(cuts):
        store, _ = damaged(tmp_path, source, at)
        report = salvage(store)
        assert report.damaged == [f"journal/{name}"] and report.kept == 3, at
        where = f"journal/{name}: byte "
        assert len(report.lost) == 1 and report.lost[0].startswith(where), (at, report.lost)
        assert int(report.lost[0][len(where):].split(":")[0]) == start, "the place of the record"
        if at >= header_end:
            assert "cell c1" in report.lost[0], "a record whose header verifies: its cell is named"
        assert stored(store) == {c: v for c, v in want.items() if c != "c1"}, at
        compact(store)
        assert stored(store) == {c: v for c, v in want.items() if c != "c1"}, at
        assert journal.journal_files(store.root) == [] and (store.root / "journal" / f"{name}.damaged").exists()
        shutil.rmtree(store.root)


def test_salvage_keeps_an_older_copy_in_its_place_in_the_order(tmp_path):
    """The salvaged file takes the damaged one's place: a newer copy in a later file still wins, an older
    verified copy stands in for a lost newer one."""
    store = RunStore(tmp_path / "run")
    store.write_cell(row("x", duration_s=1.0), lp("x", 2, -1.0))
    store.write_cell(row("y", duration_s=1.0), lp("y", 2, -1.0))
    store.write_cell(row("x", duration_s=2.0), lp("x", 3, -2.0))   # x again: this copy gets damaged
    store.write_cell(row("z", duration_s=1.0), lp("z", 2, -1.0))
    first, = journal.journal_files(store.root)
    run_store._JOURNALS.clear()                                     # a later driver: a later file
    store.write_cell(row("y", duration_s=5.0), lp("y", 4, -5.0))
    _, records = journal.scan(first)
    off, n, _ = records[2].parts["logprobs"]
    data = bytearray(first.read_bytes())
    data[off + n // 2] ^= 0xFF
    first.write_bytes(bytes(data))
    with pytest.raises(DamagedJournal):
        compact(store)
    result = CliRunner().invoke(app, ["compact", "--salvage", str(store.root)])
    assert result.exit_code == 0, result.output
    assert "kept 3 cell record(s)" in result.output and "the record of cell x: its logprobs part" in result.output
    got = stored(store)
    assert got["x"] == ("ok", 1.0, [(1, -1.0), (2, -1.0)]) and got["y"][1] == 5.0 and got["z"][1] == 1.0
    assert journal.journal_files(store.root) == []


def test_damaged_data_is_one_error_line_and_exit_4(tmp_path, source):
    root, name, (start, end), _ = source
    store, _ = damaged(tmp_path, source, start + 10)   # inside the fixed header
    for args in (["show", str(store.root)], ["compact", str(store.root)]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 4, (args, result.output)
        assert result.output.startswith("error: ") and "Traceback" not in result.output
        assert f"damaged at byte {start}" in result.output and "bench compact --salvage" in result.output
    assert (store.root / "journal" / name).exists()


def test_a_version_2_journal_damaged_in_the_middle_is_an_error_or_the_stored_rows(tmp_path):
    """tests/data/journal_v2 (a, b, a again, c; a rows record after b): each byte of b's record header
    flipped, and every 37th of its payload (~8 kB: a whole cells row).
    Version 2's checksum covers the JSON header alone; the marker, the lengths (the parts fill the payload)
    and the resync after a stretch that does not verify catch the rest."""
    src, = (ROOT / "tests" / "data" / "journal_v2").glob("*.journal2")
    _, records = journal.scan(src)
    assert [r.cell_id for r in records] == ["a", "b", "a", "c"] and records[0].row_at is not None
    start, end = records[1].at, records[2].at
    run = tmp_path / "run"
    (run / "journal").mkdir(parents=True)
    shutil.copy(src, run / "journal" / src.name)
    want = stored(RunStore(run))
    payload = min(off for off, _, _ in records[1].parts.values())
    ends = {o + d for o, n, _ in records[1].parts.values() for d in (0, n - 1)}
    for at in sorted(set(range(start, payload)) | set(range(payload, end, 37)) | ends):   # the header's every byte
        data = bytearray(src.read_bytes())
        data[at] ^= 0xFF
        (run / "journal" / src.name).write_bytes(bytes(data))
        try:
            got = stored(RunStore(run))
        except DamagedJournal as e:
            assert names_the_place(e, src.name, start, end), (at, str(e))
        else:
            assert got == want, at


def test_compaction_keeps_the_journal_when_its_files_read_back_short(tmp_path, monkeypatch):
    """The compacted files are read back before the commit: a file missing rows written to it (here a
    writer that drops a cell's logprobs) stops the compaction with why, and the journal stays."""
    from orchestrator.store import compaction

    store = RunStore(tmp_path / "run")
    for i, cid in enumerate(IDS):
        store.write_cell(row(cid, duration_s=float(i)), lp(cid, 2 + i, -float(i)))
    want = stored(store)
    files = journal.journal_files(store.root)
    add = compaction._Writer.add

    def drops_c2(self, cell_id, table):
        add(self, cell_id, table.slice(0, 0) if cell_id == "c2" else table)
        self.rows[-1] = table.num_rows   # says it wrote them

    monkeypatch.setattr(compaction._Writer, "add", drops_c2)
    with pytest.raises(compaction.Incomplete, match="read back does not hold the rows written to it"):
        compact(store)
    assert journal.journal_files(store.root) == files and stored(store) == want
    assert not (store.root / "compacted.json").exists()
    monkeypatch.undo()
    compact(store)
    assert journal.journal_files(store.root) == [] and stored(store) == want
