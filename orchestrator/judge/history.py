"""`bench history RESULTS_ROOT [--config SELECTOR]`: every run under a results root, per configuration
(a cell id: the same config in every run), its speed and quality over time, one point per run, with
what changed in its provenance since the run before (orchestrator/judge/cross_run.py's diff).

Quality is each run's own verdict against its baseline (orchestrator/judge/analysis.py), so a point says
whether that run's cell was lossless then; how two runs' outputs differ is `bench compare --against`.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from orchestrator.judge.analysis import analyse
from orchestrator.matrix.baselines import axis_value
from orchestrator.judge.cross_run import provenance_changes, provenance_columns
from orchestrator.matrix.models import AXES
from orchestrator.store.runs import list_runs

COLUMNS = ["cell_id", *AXES, "run", "started", "status", "verdict", "kl_mean", "output_tok_s", "speedup",
           "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "peak_mem_bytes", "changed"]


def history(results: str | Path, selector: dict | None = None) -> pd.DataFrame:
    """One row per (configuration, run), runs in the order they started."""
    runs = list_runs(results)
    runs = runs.assign(_t=runs.started.fillna("")).sort_values(["_t", "run"], kind="stable")
    frames, previous = [], {}
    for run, path, started in zip(runs.run, runs.path, runs.started):
        df = analyse(path)
        if selector:
            keep = pd.Series(True, index=df.index)
            for axis, value in selector.items():
                keep &= df[axis].map(lambda v, a=axis: axis_value(a, v)) == axis_value(axis, value)
            df = df[keep]
        prov = provenance_columns(Path(path))
        changed = []
        for cid in df.cell_id:
            now = prov.loc[cid].to_dict() if cid in prov.index else {}
            before = previous.get(cid)
            changed.append("first run" if before is None else "; ".join(provenance_changes(before, now)) or "")
            previous[cid] = now
        frames.append(df.assign(run=run, started=started, changed=changed).reindex(columns=COLUMNS))
    if not frames:
        return pd.DataFrame(columns=COLUMNS)
    return pd.concat(frames, ignore_index=True)
