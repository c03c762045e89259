"""`bench compact --salvage`: a run whose journal does not verify whole, folded with every record that does.

Every journal file is read record by record, each record checked whole (its header and every part
against their checksums; orchestrator/store/journal.py). A file in which something does not verify
(a torn last record alone is no damage: readers skip it already) is replaced by a copy of every
record that verifies, in their order, written under a name that sorts where the damaged file did
(`<name>.salvaged.journal3`, so a cell's newest verified copy still wins over the files before
and loses to the files after), fsynced; the damaged file is renamed `<name>.damaged` and kept,
never read again. Then the run is compacted as usual.

A file with a torn last record (a write cut off, or damage to the last record: the two cannot be
told apart in a file without its end record) is treated the same way: its verified records are
copied, the file itself kept as `*.damaged`. A file whose schemas record does not verify has its
records read with this version's types (the schemas the writer of this version writes).

What could not be kept is said, file and byte: a stretch whose record header does not verify (the
cell it held is named when its header can still be read), or a record whose part does not (its
cell is named; an earlier copy of that cell, if one verifies, is the one read now). The cells of
the run's matrix that are stored nowhere after it are listed: `bench run` into the same run dir
runs them again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.store.journal import SUFFIX, SUFFIXES, fsync_dir, journal_files, salvage_scan, write_copy
from orchestrator.store.run_store import RunStore
from orchestrator.store.schema import CELLS_FILE_SCHEMA, SIDE_TABLES


@dataclass
class SalvageReport:
    damaged: list[str] = field(default_factory=list)      # journal files replaced (run-dir relative)
    kept: int = 0                                         # cell records copied from them
    lost: list[str] = field(default_factory=list)         # "file: byte N: what", each thing not kept
    torn: list[str] = field(default_factory=list)         # torn last records (a write cut off: no damage)
    missing: list[str] = field(default_factory=list)      # cells of the matrix stored nowhere now
    cells: list[str] = field(default_factory=list)        # cells whose damaged record was not kept


def _base(name: str) -> str:
    return name[: -len(next(s for s in sorted(SUFFIXES, key=len, reverse=True) if name.endswith(s)))]


def salvage(store: RunStore) -> SalvageReport:
    """Replace every damaged journal file by the records of it that verify (see the module docstring)."""
    report = SalvageReport()
    root = store.root
    ours = {"cells": CELLS_FILE_SCHEMA, **{n: t.schema for n, t in SIDE_TABLES.items()}}
    with store.writing():
        for path in journal_files(root):
            found = salvage_scan(path, ours)
            rel = path.relative_to(root)
            if found.torn_tail:
                report.torn.append(f"{rel}: a torn last record of {found.torn_tail} bytes (a write cut off, "
                                   f"or damage to the last record: "
                                   f"{f'cell {found.torn_cell}' if found.torn_cell else 'its cell'} was not stored)")
            if found.rebuilt:
                report.lost.append(f"{rel}: its schemas record does not verify: its records were read with this "
                                   f"version's types")
            if not found.lost and not found.torn_tail:
                continue
            report.damaged.append(str(rel))
            report.lost += [f"{rel}: byte {at}: {what}" for at, what in found.lost]
            report.cells += found.lost_cells + ([found.torn_cell] if found.torn_cell else [])
            if found.records and found.schemas:
                write_copy(path.with_name(f"{_base(path.name)}.salvaged{SUFFIX}"), found.schemas, found.records)
                report.kept += len(found.records)
            os.replace(path, path.with_name(path.name + ".damaged"))
            fsync_dir(path.parent)
        if report.damaged:
            stored = set(store.stored_status())
            report.missing = sorted(c["cell_id"] for c in store.read_manifest().cells
                                    if c.get("cell_id") and c["cell_id"] not in stored)
    return report


def report_lines(run: Path, report: SalvageReport) -> list[str]:
    """What `bench compact --salvage` prints."""
    if not report.damaged:
        return [f"{run}: every journal record verifies: nothing to salvage", *report.torn]
    lines = [f"{run}: salvaged {len(report.damaged)} damaged journal file(s): kept {report.kept} cell record(s) "
             f"that verify; the damaged files are kept as *.damaged (never read)",
             "not kept:", *(f"  {line}" for line in report.lost), *report.torn]
    if report.cells:
        lines.append(f"records not kept of cell(s): {', '.join(sorted(set(report.cells))[:20])}")
    if report.missing:
        shown = ", ".join(report.missing[:20]) + (f" and {len(report.missing) - 20} more" if len(report.missing) > 20
                                                  else "")
        lines.append(f"{len(report.missing)} cell(s) of the matrix are stored nowhere now: {shown}; `bench run "
                     f"MATRIX --run-dir {run}` runs them again")
    return lines
