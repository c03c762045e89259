"""Engine telemetry and energy as both report formats show them (adapters/meters/telemetry.py, adapters/meters/energy.py):
one row per ok cell, the prefix-cache hit rate beside TTFT (what explains a TTFT saving), then preemptions,
the largest KV-cache share and server queue seen, and the energy of the timed runs. The columns are defined
once here (key, header, sort value, text, css class) for the HTML panel (report_html.py) and report.md's
table (report_md.py); a figure not measured is empty, and `not_measured` says why, grouped."""

from __future__ import annotations

from typing import Any, Callable

import pandas as pd

from orchestrator.report.data import first_line, num, table_cells
from orchestrator.store.schema import json_object
from orchestrator.values import as_text, finite

# the figures whose null the panel explains: (column, name in the reasons list)
FIGURES = (("prefix_cache_hit_rate", "prefix-cache hit rate"), ("preemptions", "preemptions"),
           ("kv_cache_usage_max", "KV-cache usage max"), ("requests_waiting_max", "requests waiting max"),
           ("energy_j", "energy"), ("energy_j_per_token", "energy per token"))


def _pct(v: Any) -> str:
    return f"{v:.1%}" if finite(v) else ""


def _hit(r: dict) -> str:
    if not finite(r.get("prefix_cache_hit_rate")):
        return ""
    return (f"{r['prefix_cache_hit_rate']:.1%} ({num(r.get('prefix_cache_hits'), '.0f')} / "
            f"{num(r.get('prefix_cache_queries'), '.0f')} tokens)")


def _energy(r: dict) -> str:
    if not finite(r.get("energy_j")):
        return ""
    return f"{r['energy_j']:.4g}" + (f" ({r['energy_source']})" if isinstance(r.get("energy_source"), str) else "")


def columns(with_workload: bool) -> list[tuple[str, str, Callable[[dict], Any], Callable[[dict], str], str]]:
    cols = [("config", "engine config", lambda r: r["config"], lambda r: r["config"], "")]
    if with_workload:
        cols.append(("workload", "workload", lambda r: r.get("workload"), lambda r: as_text(r.get("workload")), ""))
    return cols + [
        ("load", "load", lambda r: r["load_label"], lambda r: r["load_label"], ""),
        ("ttft-p50", "TTFT p50 ms", lambda r: r.get("ttft_ms_p50"), lambda r: num(r.get("ttft_ms_p50"), ".2f"), "n"),
        ("ttft-p99", "TTFT p99 ms", lambda r: r.get("ttft_ms_p99"), lambda r: num(r.get("ttft_ms_p99"), ".2f"), "n"),
        ("hit", "prefix-cache hit rate (hits / queries)", lambda r: r.get("prefix_cache_hit_rate"), _hit, "n"),
        ("preempt", "preemptions", lambda r: r.get("preemptions"), lambda r: num(r.get("preemptions"), ".0f"), "n"),
        ("kv", "KV-cache usage max", lambda r: r.get("kv_cache_usage_max"), lambda r: _pct(r.get("kv_cache_usage_max")),
         "n"),
        ("queue", "requests waiting max", lambda r: r.get("requests_waiting_max"),
         lambda r: num(r.get("requests_waiting_max"), ".0f"), "n"),
        ("energy", "energy J", lambda r: r.get("energy_j"), _energy, "n"),
        ("j-tok", "J / output token", lambda r: r.get("energy_j_per_token"),
         lambda r: num(r.get("energy_j_per_token"), ".4g"), "n"),
        ("tok-s", "out tok/s", lambda r: r.get("output_tok_s"), lambda r: num(r.get("output_tok_s"), ".1f"), "n"),
    ]


def has_workloads(df: pd.DataFrame) -> bool:
    return "workload" in df and df["workload"].notna().any()


def rows(df: pd.DataFrame) -> tuple[list[dict], str]:
    """The ok cells the table shows (the cells table's cap and note), by config, workload and load."""
    shown, note = table_cells(df)
    ok = shown[shown.status == "ok"]
    recs = ok.to_dict("records")
    return sorted(recs, key=lambda r: (r["config"], as_text(r.get("workload")), r.get("mode") or "",
                                       r["batch_size"], r.get("request_rate") if finite(r.get("request_rate")) else 0)), note


def measured(recs: list[dict]) -> bool:
    return any(finite(r.get(col)) for r in recs for col, _ in FIGURES)


def not_measured(recs: list[dict]) -> list[str]:
    """'figures: reason (n cells: a, b, ...)' for the figures left null, grouped by the stored reason (and
    by which figures a cell lacks for it, so one engine's missing metrics read as one line)."""
    groups: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for r in recs:
        missing = json_object(r.get("missing"))
        by_reason: dict[str, list[str]] = {}
        for col, name in FIGURES:
            if not finite(r.get(col)):
                why = first_line(missing.get(col), 240) or "no reason stored (a row of before the figure existed)"
                by_reason.setdefault(why, []).append(name)
        for why, names in by_reason.items():
            groups.setdefault((why, tuple(names)), []).append(r.get("label") or r["config"])
    out = []
    for (why, names), labels in groups.items():
        shown = ", ".join(labels[:4]) + (f", and {len(labels) - 4} more" if len(labels) > 4 else "")
        out.append(f"{', '.join(names)}: {why} ({len(labels)} cell{'s' if len(labels) != 1 else ''}: {shown})")
    return out


EXPLANATION = ("Per ok cell, the engine's own counters over the timed runs (a served cell: its /metrics, scraped "
               "before and after each load point): the prefix-cache hit rate is prompt tokens found in the cache / "
               "prompt tokens looked up, beside TTFT; preemptions are requests the scheduler preempted; the KV-cache "
               "usage and requests-waiting maxima are the largest of the server's gauge samples (one a second); "
               "energy is what RAPL (CPU packages) or NVML (GPUs) counted over the timed runs, whole packages or "
               "GPUs, so other work on them counts too. An empty figure was not measured: the reasons follow.")
