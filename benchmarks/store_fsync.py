"""What the store's durability and checks cost: compaction with and without its fsyncs, with and without
its verification (every journal part checked, the compacted files read back), and what an fsync after
every journal record would add to storing a cell.

    .venv/bin/python benchmarks/store_fsync.py [--cells 2000] [--rows 256] [--repeats 3] [--dir /tmp]
    .venv/bin/python benchmarks/store_fsync.py --quick    # 50 cells x 16 rows, one repeat (CI)

Each variant runs on its own copy of one journal, the variants interleaved per repeat; medians are printed.
The folder (--dir) decides the file system and disk measured: give the one results/ lives on.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.store import compaction, journal, run_store  # noqa: E402
from orchestrator.store.compaction import compact  # noqa: E402
from orchestrator.store.run_store import RunStore  # noqa: E402
from tests.helpers import lp, row  # noqa: E402


@contextmanager
def patched(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def build(root: Path, cells: int, rows: int, sync: bool) -> float:
    """Store `cells` cells (each with `rows` logprob rows); seconds per cell. `sync`: fdatasync after each."""
    run_store._JOURNALS.clear()
    store = RunStore(root)
    t = time.perf_counter()
    for i in range(cells):
        store.write_cell(row(f"c{i:06d}", duration_s=1.0), lp(f"c{i:06d}", rows, -1.0 - i % 7))
        if sync:
            fd = os.open(store.root / "journal" / run_store._JOURNALS[(str(store.root.resolve()), os.getpid())].path.name,
                         os.O_RDONLY)
            os.fdatasync(fd)
            os.close(fd)
    return (time.perf_counter() - t) / cells


def timed_compact(src: Path, dst: Path, variant: str) -> float:
    shutil.copytree(src, dst)
    os.sync()
    ctx = {"as shipped": patched(os, "getpid", os.getpid),   # no change
           "no fsync": patched(os, "fsync", lambda fd: None),
           "no verify, no read-back": patched(compaction, "_read_back", lambda *a: None)}[variant]
    verify = journal.JournalReader.verify
    with ctx:
        if variant == "no verify, no read-back":
            journal.JournalReader.verify = lambda self, records: None
        try:
            t = time.perf_counter()
            compact(RunStore(dst))
            return time.perf_counter() - t
        finally:
            journal.JournalReader.verify = verify


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=2000)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--quick", action="store_true", help="50 cells x 16 rows, one repeat, for CI (seconds)")
    a = ap.parse_args()
    if a.quick:
        a.cells, a.rows, a.repeats = 50, 16, 1
    base = Path(tempfile.mkdtemp(prefix="store-fsync-", dir=a.dir))
    try:
        appends = {"no fsync (as shipped)": [], "fdatasync per record": []}
        for r in range(a.repeats):
            for sync in (False, True):
                appends["fdatasync per record" if sync else "no fsync (as shipped)"].append(
                    build(base / f"append-{r}-{sync}", min(a.cells, 500), a.rows, sync))
                shutil.rmtree(base / f"append-{r}-{sync}")
        src = base / "src"
        build(src, a.cells, a.rows, False)
        size = sum(p.stat().st_size for p in (src / "journal").iterdir())
        times = {v: [] for v in ("as shipped", "no fsync", "no verify, no read-back")}
        for r in range(a.repeats):
            for v in times:
                times[v].append(timed_compact(src, base / f"c-{r}-{len(times[v])}-{v.replace(' ', '_')}", v))
        print(f"{a.cells} cells x {a.rows} logprob rows, journal {size / 1e6:.1f} MB, in {base.parent}")
        for v, ts in appends.items():
            print(f"store a cell, {v}: {statistics.median(ts) * 1e3:.3f} ms")
        ship = statistics.median(times["as shipped"])
        for v, ts in times.items():
            m = statistics.median(ts)
            print(f"compact, {v}: {m:.3f} s ({m / ship:.2f}x as shipped; runs {', '.join(f'{t:.3f}' for t in ts)})")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
