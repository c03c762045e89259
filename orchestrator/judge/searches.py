"""SLO searches of a run (serve.search, adapters/serving/slo_search.py), read back from the cells table: one
summary per searched configuration and its probes in the order they were made.

A probe row belongs to the search named by its search_id; a search re-run (--rerun-failed) rewrites
probes 0..n-1 in place, so only probes numbered below the search's own `search_probes` are its own
(a longer earlier try may have left more)."""

from __future__ import annotations

import pandas as pd

from orchestrator.store.schema import json_object


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
    # a boolean Series, not a list: an empty list would select no columns instead of no rows
    p = p[pd.Series([sid in made.index and n < (made[sid] if made[sid] == made[sid] else 0)
                     for sid, n in zip(p["search_id"], p["search_probe"])], index=p.index, dtype=bool)]
    return p.sort_values(["search_id", "search_probe"])


def checks(row) -> dict:
    return json_object(row.get("search_checks") if isinstance(row, dict) else getattr(row, "search_checks", None))


def slos_text(row: dict) -> str:
    """The SLOs a search was run against, and how a p99 was judged: 'ttft p99<=300ms, goodput>=0.9 (point)'."""
    slos = json_object(row.get("search_slos"))
    stated = [f"{k.replace('_p99_ms', ' p99')}<={slos[k]:g}ms" for k in ("ttft_p99_ms", "tpot_p99_ms", "e2e_p99_ms")
              if slos.get(k) is not None] + ([f"goodput>={slos['goodput']:g}"] if slos.get("goodput") else [])
    return ", ".join(stated) + f" ({slos.get('judge', 'point')})"


def variable(row: dict) -> str:
    return row.get("search_variable") or json_object(row.get("search_slos")).get("variable", "rate")


def load_text(variable: str, v) -> str:
    """A searched load: '8/s' (rate) or 'c=4' (concurrency); '-' for none."""
    if v is None or v != v:
        return "-"
    return f"{v:g}/s" if variable == "rate" else f"c={v:g}"


def requests_per_probe(search_id: str, probes: pd.DataFrame) -> str:
    mine = probes[probes.search_id == search_id]
    return ",".join(map(str, sorted({int(x) for x in mine.requests_planned.dropna()}))) or "-"


def p99_text(row: dict, figure: str, key: str) -> str:
    """A probe's p99 of `figure` (ttft_ms, tpot_ms, e2e_ms) with its interval where its SLO was checked:
    '120.3 [98.1, 160.0]' (an interval without an upper end: 'inf')."""
    v = row.get(f"{figure}_p99")
    text = "-" if v is None or v != v else f"{v:.1f}"
    c = checks(row)
    if key not in c:
        return text
    lo, hi = (f"{c[key][e]:.1f}" if c[key][e] is not None else "inf" for e in ("lo", "hi"))
    return f"{text} [{lo}, {hi}]"
