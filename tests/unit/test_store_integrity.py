"""Every byte of a run dir at rest verifiable (issue 41): flipped bytes in the compacted files and in
manifest.json/compacted.json are DamagedFile (exit 4) naming the file, never a changed value, and
`bench verify` finds each; damage to the last journal record of a finished run is damage or a listed
missing cell, and the journal is kept; no link inside a run dir is followed. Real Parquet and journal
files, written by the store's own writer."""

import random
import shutil

import pytest

from orchestrator.store.compaction import compact
from orchestrator.store.integrity import DamagedFile, LinkRefused
from orchestrator.store.journal import DamagedJournal, journal_files, scan
from orchestrator.store.run_store import RunStore
from orchestrator.store.salvage import salvage
from orchestrator.store.verify import missing_cells, verify_run
from tests.helpers import lp, row, small_store

FLIPS = 2000


def _planned(store: RunStore, n: int = 6) -> None:
    store.write_manifest({"cells": [{"cell_id": f"c{i}"} for i in range(n)]})


def _everything(store: RunStore):
    """Every value a reader reads: the cells, the logprobs and the manifest."""
    cells = store.read_cells_table().sort_by("cell_id")
    lps = store.read_logprobs().sort_by([("cell_id", "ascending"), ("position", "ascending")])
    files = store.logprob_files()
    return cells, lps, store.read_manifest().to_json(), sorted(map(str, files.values()))


@pytest.fixture(scope="module")
def compacted(tmp_path_factory):
    store = small_store(tmp_path_factory.mktemp("integrity"))
    _planned(store)
    compact(store)
    return store


def test_every_sampled_flip_in_compacted_files_and_indexes_is_damage_naming_the_file(compacted):
    store = compacted
    want = _everything(store)
    assert verify_run(store.root).ok
    files = [p for p in store.root.rglob("*") if p.is_file() and (p.suffix == ".parquet" or p.name in
                                                                      ("manifest.json", "compacted.json"))]
    assert {p.name for p in files} >= {"manifest.json", "compacted.json"} and len(files) >= 4
    sizes = {p: p.stat().st_size for p in files}
    total = sum(sizes.values())
    rng = random.Random(41)
    flips = sorted(rng.sample(range(total), min(FLIPS, total)))   # positions over all files, end to end
    detected = 0
    for pos in flips:
        for p in files:
            if pos < sizes[p]:
                break
            pos -= sizes[p]
        data = bytearray(p.read_bytes())
        orig = data[pos]
        data[pos] ^= 1 << rng.randrange(8)
        p.write_bytes(bytes(data))
        try:
            try:
                got = _everything(store)
            except DamagedFile as e:
                assert str(p) in str(e) and "\n" not in str(e) and e.bench_exit_code == 4
                detected += 1
            else:
                assert got == want, f"a flip at byte {pos} of {p.name} changed what was read"
            assert not verify_run(store.root).ok, f"bench verify missed a flip at byte {pos} of {p.name}"
        finally:
            data[pos] = orig
            p.write_bytes(bytes(data))
    assert detected == len(flips)   # every byte is covered by a digest: every flip is found on open
    assert _everything(store) == want


def _finished_journal(tmp_path) -> tuple[RunStore, int, int]:
    """A run of 6 cells in its journal, the writer done (end record): (store, start of the last cell
    record, start of the end record)."""
    store = small_store(tmp_path)
    _planned(store)
    store.close_journal()
    path, = journal_files(store.root)
    _, records = scan(path)
    last = records[-1].at
    end = max(off + n for off, n, _ in records[-1].parts.values())
    assert records[-1].cell_id == "c5" and end < path.stat().st_size
    return store, last, end


def _damages(last: int, end: int, size: int):
    head = 24 + 60   # the fixed header and the start of the JSON header
    for i in range(last, last + head):
        yield f"header byte {i - last}", lambda b, i=i: b[:i] + bytes([b[i] ^ 0x10]) + b[i + 1:]
    for i in range(last + head + 40, end, max(1, (end - last - head - 40) // 12)):
        yield f"payload byte {i - last}", lambda b, i=i: b[:i] + bytes([b[i] ^ 0x01]) + b[i + 1:]
    for cut in (last + 3, last + 30, (last + end) // 2, end - 1, end + 5):
        yield f"truncated at {cut - last}", lambda b, cut=cut: b[:cut]
    yield "tail zeroed (4 KiB)", lambda b: b[:max(0, len(b) - 4096)] + bytes(min(4096, len(b)))


def test_damage_to_the_last_record_of_a_finished_journal_is_damage_or_a_listed_missing_cell(tmp_path):
    base, last, end = _finished_journal(tmp_path / "base")
    path, = journal_files(base.root)
    good = path.read_bytes()
    seen = {"exit 4": 0, "missing": 0, "whole": 0}
    for n, (what, damage) in enumerate(_damages(last, end, len(good))):
        run = tmp_path / f"d{n}"
        shutil.copytree(base.root, run / "run")
        store = RunStore(run / "run")
        jpath = store.root / path.relative_to(base.root)
        jpath.write_bytes(damage(good))
        try:
            stored = set(store.read_cells_table(["cell_id"])["cell_id"].to_pylist())
            store.read_logprobs()
            loud = False
        except DamagedJournal as e:
            assert e.bench_exit_code == 4 and str(jpath) in str(e)
            loud, stored = True, None
        missing = {}
        if not loud:   # read without a word of damage: every cell there, or the lost one listed
            missing = dict(missing_cells(store))
            assert stored | set(missing) == {f"c{i}" for i in range(6)}, what
            assert all(why.startswith("not stored (") for why in missing.values()), missing   # with the reason
        try:
            compact(store)   # checks every part of every record (a cells part read from the rows record is not read)
        except DamagedJournal:
            assert jpath.exists(), what            # nothing folded, nothing deleted
            loud = True
        else:
            kept = list(jpath.parent.glob("*.damaged"))
            if stored != {f"c{i}" for i in range(6)}:
                assert kept, f"{what}: compaction deleted a journal holding a record it did not fold"
        seen["exit 4" if loud else "missing" if missing else "whole"] += 1
        if jpath.exists():
            rep = salvage(store)
            assert jpath.with_name(jpath.name + ".damaged").exists(), what
            assert rep.damaged, what
        assert list(jpath.parent.glob("*.damaged")) or jpath.exists(), what   # the bytes are kept
    # every flip is loud (a verified end record follows); a cut that removes the end record too is a
    # listed missing cell; only a cut inside the end record itself leaves every cell whole
    assert seen["exit 4"] >= 90 and seen["missing"] == 4 and seen["whole"] == 1, seen


def test_a_damaged_schemas_record_costs_no_record_that_verifies(tmp_path):
    store = small_store(tmp_path)
    _planned(store)
    store.close_journal()
    path, = journal_files(store.root)
    data = bytearray(path.read_bytes())
    data[len(b"lossless-bench journal 3\n") + 40] ^= 0xFF   # inside the schemas record's header
    path.write_bytes(bytes(data))
    with pytest.raises(DamagedJournal):
        store.read_cells_table()
    rep = salvage(store)
    assert rep.kept == 6 and path.with_name(path.name + ".damaged").exists()
    assert sorted(store.read_cells_table(["cell_id"])["cell_id"].to_pylist()) == [f"c{i}" for i in range(6)]
    assert any("schemas record does not verify" in line for line in rep.lost)


def test_a_torn_tail_of_a_killed_writer_is_a_listed_missing_cell_and_is_kept(tmp_path):
    store = small_store(tmp_path)   # no end record: a writer that was killed
    _planned(store, 7)
    store.write_cell(row("c6", "hf"), lp("c6", 5, -1.0))
    path, = journal_files(store.root)
    data = path.read_bytes()
    path.write_bytes(data[:-7])    # the last write cut off
    assert dict(missing_cells(store)) == {"c6": f"not stored (its record in {path.relative_to(store.root)} at byte "
                                                f"{_torn_at(path)} does not verify (a write cut off, or damage))"}
    from typer.testing import CliRunner

    from orchestrator.cli import app

    res = CliRunner().invoke(app, ["compact", str(store.root)])
    assert res.exit_code == 0 and f"kept {path.relative_to(store.root)}.damaged: from byte" in res.output, res.output
    assert "(cell c6 not stored)" in res.output, res.output
    assert path.with_name(path.name + ".damaged").exists() and not path.exists()
    assert sorted(store.stored_status()) == [f"c{i}" for i in range(6)]


def _torn_at(path) -> int:
    tails: dict = {}
    scan(path, tails)
    return tails[path][0]


@pytest.mark.parametrize("name", [".lock", "run.log", "cells", "manifest.json"])
def test_no_link_inside_a_run_dir_is_followed(tmp_path, name):
    store = small_store(tmp_path)
    _planned(store)
    compact(store)
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / name
    if name == "cells":
        shutil.move(store.root / "cells", target)
    else:
        if (store.root / name).exists():
            shutil.move(store.root / name, target)
        else:
            target.write_text("keep me\n")
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in outside.rglob("*") if p.is_file()}
    (store.root / name).symlink_to(target, target_is_directory=target.is_dir())
    from orchestrator.execution.scheduling.scheduler import ray_log_into

    calls = [lambda: compact(store), lambda: store.read_cells_table(), lambda: store.read_manifest(),
             lambda: ray_log_into(store.root / "run.log")]
    refused = 0
    for call in calls:
        try:
            call()
        except LinkRefused as e:
            assert "\n" not in str(e) and str(store.root / name) in str(e)
            refused += 1
    assert refused >= 1
    after = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in outside.rglob("*") if p.is_file()}
    assert after == before   # nothing outside changed
    assert not verify_run(store.root).ok



def test_bench_verify_show_and_compact_say_it_in_one_line_and_exit_4(tmp_path):
    from typer.testing import CliRunner

    from orchestrator.cli import app

    store = small_store(tmp_path)
    _planned(store, 7)   # c6 planned, never stored
    compact(store)
    res = CliRunner().invoke(app, ["verify", str(store.root)])
    assert res.exit_code == 0 and "journal record(s) verify" in res.output, res.output
    res = CliRunner().invoke(app, ["show", str(store.root), "--format", "csv"])
    assert res.exit_code == 0 and "c6: missing: not stored" in res.output, res.output
    from orchestrator.report.write import write_report

    for page in write_report(store.root):
        assert "1 planned cell(s) missing: c6: not stored" in page.read_text(), page
    part = next(store.root.glob("logprobs/framework=*/compacted-*.parquet"))
    data = bytearray(part.read_bytes())
    data[len(data) // 3] ^= 0x04
    part.write_bytes(bytes(data))
    for cmd in (["verify"], ["export", "--no-verdicts", "--logprobs"], ["compact"]):
        res = CliRunner().invoke(app, [*cmd, str(store.root)])
        assert res.exit_code == 4 and str(part) in res.output.replace("\n", ""), (cmd, res.output)
    (store.root / ".lock").unlink(missing_ok=True)
    (tmp_path / "elsewhere").write_text("precious\n")
    (store.root / ".lock").symlink_to(tmp_path / "elsewhere")
    res = CliRunner().invoke(app, ["compact", str(store.root)])
    assert res.exit_code == 2 and "symbolic link" in res.output and res.output.count("error") == 1, res.output
    assert (tmp_path / "elsewhere").read_text() == "precious\n"
