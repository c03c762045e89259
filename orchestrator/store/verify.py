"""`bench verify RUN`: every file and every record of a run dir checked, streamed (nothing is read
whole into memory), for CI and archives; and the planned cells a run dir does not hold (`missing`).

What is checked (orchestrator/store/integrity.py says what readers check as they read):
  links          no symbolic link anywhere under the run dir
  manifest.json  its digest (sealed); one written by an earlier version has none: said, not an error
  compacted.json its digest; every live compacted file: its size, footer and whole sha256 as recorded
                 (an earlier version's file without them: every page read with checksum verification)
  journal/       every record: its header and every part against their checksums; a stretch that is
                 no record that verifies (damage, or a torn last record: a cell not stored)
  per-cell files (earlier versions) every page read
Files kept as `*.damaged` (salvage, compaction) are listed, never read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.store.integrity import DamagedFile, LinkRefused, check_file, read_sealed
from orchestrator.store.journal import DamagedJournal, journal_files, salvage_scan
from orchestrator.store.layout import COMMIT_FILE, is_cell_file
from orchestrator.store.schema import SIDE_TABLES


@dataclass
class VerifyReport:
    checked: list[str] = field(default_factory=list)    # run-dir relative paths checked whole
    problems: list[str] = field(default_factory=list)   # "path: what", each thing that does not verify
    notes: list[str] = field(default_factory=list)      # what is not an error (unsealed old files, *.damaged kept)
    records: int = 0                                    # journal records verified

    @property
    def ok(self) -> bool:
        return not self.problems


def _links(root: Path, report: VerifyReport) -> None:
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if p.is_symlink():
                report.problems.append(str(LinkRefused(p)))
            elif name.endswith(".damaged"):
                report.notes.append(f"{p.relative_to(root)}: kept damaged file (never read)")


def _sealed(root: Path, name: str, report: VerifyReport) -> dict | None:
    path = root / name
    if path.is_symlink():
        return None
    try:
        data = read_sealed(path)
    except DamagedFile as e:
        report.problems.append(str(e))
        return None
    if data is not None:
        report.checked.append(name)
        if not (root / name).read_bytes().startswith(b'{"digest"'):
            report.notes.append(f"{name}: written by an earlier version, without a digest (not verifiable)")
    return data


def _pages(path: Path, root: Path, report: VerifyReport) -> None:
    """Every page of a Parquet file read (checksums verified where it has them), batch by batch."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        for _ in pq.ParquetFile(str(path), page_checksum_verification=True).iter_batches(batch_size=65536):
            pass
        report.checked.append(str(path.relative_to(root)))
    except (OSError, pa.ArrowException) as e:
        report.problems.append(f"{path}: damaged: it does not read back ({str(e)[:200]})")


def verify_run(root: Path) -> VerifyReport:
    """Check every file of the run dir at `root` (see the module docstring)."""
    root = Path(root)
    report = VerifyReport()
    _links(root, report)
    _sealed(root, "manifest.json", report)
    record = _sealed(root, COMMIT_FILE, report) or {}
    facts = record.get("files") or {}
    live = {rel: fw for fw, rel in (record.get("cells") or {}).items()}
    for name in SIDE_TABLES:
        live.update((rel, None) for rel in record.get(name) or {})
    for rel in sorted(live):
        path = root / rel
        if path.is_symlink():
            continue
        cells = next((info["cells"] for name in SIDE_TABLES for r, info in (record.get(name) or {}).items()
                      if r == rel), None)
        if not path.exists():
            report.problems.append(f"{path}: missing (compacted.json names it)")
        elif rel in facts:
            try:
                check_file(path, facts[rel], cells, whole=True)
                report.checked.append(rel)
            except DamagedFile as e:
                report.problems.append(str(e))
        else:
            _pages(path, root, report)
    for path in journal_files(root):
        if path.is_symlink():
            continue
        try:
            found = salvage_scan(path, keep=False)
        except (DamagedJournal, OSError) as e:
            report.problems.append(str(e))
            continue
        report.records += len(found.records)
        problems = [f"byte {at}: {what}" for at, what in found.lost]
        if found.torn_tail:
            problems.append(f"a torn last record of {found.torn_tail} bytes (a write cut off, or damage to the last "
                            f"record)" + (f": cell {found.torn_cell} not stored" if found.torn_cell else ""))
        report.problems += [f"{path}: {p}" for p in problems]
        if not problems:
            report.checked.append(str(path.relative_to(root)))
    for table in ("cells", *SIDE_TABLES):
        base = root / table
        if not base.is_dir() or base.is_symlink():
            continue
        for part in sorted(base.iterdir()):
            if part.is_symlink() or not part.is_dir():
                continue
            for f in sorted(part.iterdir()):
                if is_cell_file(f.name) and not f.is_symlink():
                    _pages(f, root, report)
    return report


def report_lines(run: Path, report: VerifyReport) -> list[str]:
    """What `bench verify` prints: a summary line, then each problem, then the notes."""
    head = (f"{run}: {len(report.checked)} file(s) and {report.records} journal record(s) verify"
            if report.ok else f"{run}: {len(report.problems)} problem(s); {len(report.checked)} file(s) and "
                              f"{report.records} journal record(s) verify")
    return [head, *(f"  {p}" for p in report.problems), *(f"  note: {n}" for n in report.notes)]


def missing_cells(store) -> list[tuple[str, str]]:
    """(cell_id, why) of every planned cell (the manifest's) that the run dir holds no row of: `missing:
    not stored`, with what is known (a torn or damaged last journal record naming it, a kept *.damaged
    journal)."""
    planned = [c["cell_id"] for c in store.read_manifest().cells if c.get("cell_id")]
    if not planned:
        return []
    lay = store.layout()
    stored = set(lay.read_cells(["cell_id"])["cell_id"].to_pylist())
    torn = {cid: f"its record in {p.relative_to(store.root)} at byte {at} does not verify (a write cut off, or damage)"
            for p, (at, cid) in lay.tails.items() if cid}
    kept = sorted(str(p.relative_to(store.root)) for p in (store.root / "journal").glob("*.damaged")) \
        if (store.root / "journal").is_dir() else []
    unnamed = [f"{p.relative_to(store.root)} ends at byte {at} in a record that does not verify (its cell cannot "
               f"be told)" for p, (at, cid) in lay.tails.items() if not cid]
    if kept:
        unnamed.append(f"a journal holding bytes that do not verify is kept: {', '.join(kept[:3])}")
    out = []
    for cid in planned:
        if cid in stored:
            continue
        why = torn.get(cid) or "; ".join(unnamed)
        out.append((cid, "not stored" + (f" ({why})" if why else "")))
    return out
