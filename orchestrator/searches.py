"""SLO searches of a run (serve.search, adapters/slo_search.py), read back from the cells table: one
summary per searched configuration and its probes in the order they were made.

A probe row belongs to the search named by its search_id; a search re-run (--rerun-failed) rewrites
probes 0..n-1 in place, so only probes numbered below the search's own `search_probes` are its own
(a longer earlier try may have left more)."""

from __future__ import annotations

import json

import pandas as pd


def is_probe(cells: pd.DataFrame) -> pd.Series:
    return cells["search_probe"].notna() if "search_probe" in cells else pd.Series(False, index=cells.index)


def summaries(cells: pd.DataFrame) -> pd.DataFrame:
    """The searches' own rows (one per configuration searched)."""
    if "search_id" not in cells:
        return cells.iloc[0:0]
    rows = cells[cells["search_id"].notna() & ~is_probe(cells)]
    return rows.sort_values(["framework", "model", "quantization", "flags", "batch_size", "input_len", "output_len"])


def probes(cells: pd.DataFrame) -> pd.DataFrame:
    """Every search's current probes, in order: search_id, then probe number."""
    if "search_id" not in cells:
        return cells.iloc[0:0]
    made = summaries(cells).set_index("cell_id")["search_probes"]
    p = cells[is_probe(cells)]
    p = p[[sid in made.index and n < (made[sid] if made[sid] == made[sid] else 0)
           for sid, n in zip(p["search_id"], p["search_probe"])]]
    return p.sort_values(["search_id", "search_probe"])


def checks(row) -> dict:
    return json_dict(row.get("search_checks") if isinstance(row, dict) else getattr(row, "search_checks", None))


def json_dict(text) -> dict:
    """A JSON object stored as text (a row's JSON column); {} for null, malformed or not an object."""
    if not isinstance(text, str) or not text:
        return {}
    try:
        v = json.loads(text)
    except ValueError:
        return {}
    return v if isinstance(v, dict) else {}
