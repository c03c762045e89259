"""`bench ls`: the runs in a results root, one row each."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from orchestrator.store.run_store import RunStore, is_run_dir


def is_run(path: Path) -> bool:
    return is_run_dir(path)


def list_runs(results: str | Path) -> pd.DataFrame:
    """One row per run directory in `results` (or `results` itself when it is a run)."""
    root = Path(results)
    runs = [root] if is_run(root) else sorted(p for p in root.iterdir() if p.is_dir() and is_run(p)) \
        if root.is_dir() else []
    rows = []
    for path in runs:
        store = RunStore(path)
        manifest = store.read_manifest()
        t = store.read_cells_table(["status", "framework", "search_probe"])   # per-cell and compacted files, each cell once
        planned_rows = [p is None for p in t["search_probe"].to_pylist()]   # a search's probes are extra rows
        status = [s for s, keep in zip(t["status"].to_pylist(), planned_rows) if keep]
        frameworks = t["framework"].to_pylist()
        sessions = manifest.sessions
        started = min((s.started for s in sessions if s.started), default=None)
        ended = sessions[-1].ended if sessions else None
        rows.append({"run": path.name, "path": str(path), "matrix": manifest.name,
                     "ok": sum(s == "ok" for s in status), "stored": len(status),
                     "planned": len(manifest.cells) or len(status),
                     "frameworks": ",".join(sorted(set(frameworks))), "started": started, "ended": ended})
    return pd.DataFrame(rows, columns=["run", "path", "matrix", "ok", "stored", "planned", "frameworks", "started",
                                       "ended"])
