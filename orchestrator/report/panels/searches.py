"""SLO searches (serve.search) as both report formats show them (orchestrator/judge/searches.py reads them back):
per searched configuration the highest load meeting every SLO, the first load above it that missed and
what it missed; then every probe in order with its p99s and their intervals. The columns of both tables
are defined once here (key, header, sort value, text, css class) for the HTML panel (report_html.py) and
report.md (report_md.py). Also `bench explain`'s culprit searches, the section "Why is this cell lossy": per
explained cell its outcome and its probes, read from RUN/explain/<cell_id>/explain.json; and `bench explain --layers`
layer reports (RUN/explain/<cell_id>/layers.json, layers.parquet): per layer the relative error against the floor."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from orchestrator.judge import searches
from orchestrator.report.data import first_line, num
from orchestrator.values import finite


@dataclass
class SearchLayer:
    summaries: pd.DataFrame    # one row per searched configuration (its own row), with the report's labels
    probes: pd.DataFrame       # its probes, in the order made, with their search's config label
    error: str | None = None   # why the searches could not be read


def load_searches(root: str | Path, df: pd.DataFrame) -> SearchLayer | None:
    """The run's searches, or None for a run without any (the report then has no search section); the
    labels come from the report's cells frame `df` (which holds the searches' own rows, not the probes)."""
    from orchestrator.store.run_store import RunStore

    try:
        cells = RunStore(root).read_cells()
        found = searches.summaries(cells)
        if not len(found):
            return None
        probes = searches.probes(cells)
    except Exception as e:  # noqa: BLE001 - reported on the page, not raised
        return SearchLayer(pd.DataFrame(), pd.DataFrame(), f"{type(e).__name__}: {first_line(str(e), 400)}")
    labels = df.drop_duplicates("cell_id").set_index("cell_id")["config"] if "config" in df else pd.Series(dtype=object)
    found = found.assign(config=[labels.get(c) or f"{fw}/{m}/{q}/{fl}" for c, fw, m, q, fl in zip(
        *(found[k] for k in ("cell_id", "framework", "model", "quantization", "flags")))])
    probes = probes.assign(config=[labels.get(s, s) for s in probes.search_id])
    return SearchLayer(found.reset_index(drop=True), probes.reset_index(drop=True))


Column = tuple[str, str, Callable[[dict], Any], Callable[[dict], str], str]


def _status(r: dict) -> str:
    return "" if r.get("status") == "ok" else f"{r.get('status')}: "


def summary_columns(probes: pd.DataFrame) -> list[Column]:
    return [
        ("config", "engine config", lambda r: r["config"], lambda r: r["config"], ""),
        ("lens", "in / out", lambda r: r["input_len"], lambda r: f"{r['input_len']} / {r['output_len']}", "n"),
        ("search", "search", lambda r: searches.variable(r),
         lambda r: f"{searches.variable(r)}, c<={int(r['batch_size'])}", ""),
        ("slos", "SLOs (judge)", lambda r: searches.slos_text(r), lambda r: searches.slos_text(r), ""),
        ("max", "max met", lambda r: r.get("search_max"),
         lambda r: _status(r) + searches.load_text(searches.variable(r), r.get("search_max")), "n"),
        ("fail", "first miss", lambda r: r.get("search_fail"),
         lambda r: searches.load_text(searches.variable(r), r.get("search_fail")), "n"),
        ("probes", "probes", lambda r: r.get("search_probes"), lambda r: num(r.get("search_probes"), ".0f"), "n"),
        ("per-probe", "requests / probe", lambda r: searches.requests_per_probe(r["cell_id"], probes),
         lambda r: searches.requests_per_probe(r["cell_id"], probes), "n"),
        ("missed", "missed there", lambda r: r.get("search_missed") or "", lambda r: first_line(r.get("search_missed"), 300),
         "reason"),
    ]


def probe_columns() -> list[Column]:
    def p99(figure: str, key: str) -> tuple[Callable, Callable]:
        return (lambda r: r.get(f"{figure}_p99"), lambda r: searches.p99_text(r, figure, key))

    return [
        ("config", "search of", lambda r: r["config"], lambda r: r["config"], ""),
        ("n", "#", lambda r: r["search_probe"], lambda r: str(int(r["search_probe"])), "n"),
        ("load", "load", lambda r: r.get("request_rate") if finite(r.get("request_rate")) else r.get("batch_size"),
         lambda r: searches.load_text("rate", r["request_rate"]) if finite(r.get("request_rate"))
         else f"c={int(r['batch_size'])}", "n"),
        ("requests", "requests", lambda r: r.get("requests"), lambda r: num(r.get("requests"), ".0f"), "n"),
        ("ttft", "TTFT p99 ms [interval]", *p99("ttft_ms", "ttft_p99_ms"), "n"),
        ("tpot", "TPOT p99 ms [interval]", *p99("tpot_ms", "tpot_p99_ms"), "n"),
        ("e2e", "e2e p99 ms [interval]", *p99("e2e_ms", "e2e_p99_ms"), "n"),
        ("goodput", "goodput", lambda r: r.get("goodput"), lambda r: num(r.get("goodput"), ".3f"), "n"),
        ("verdict", "meets", lambda r: int(bool(r.get("search_meets"))), lambda r: "yes" if r.get("search_meets") else "no",
         "verdict"),
        ("missed", "missed", lambda r: r.get("search_missed") or "", lambda r: first_line(r.get("search_missed"), 300),
         "reason"),
    ]


EXPLANATION = ("Per searched serve configuration (serve.search), the highest load at which every SLO was met, "
               "found by bracketing and bisection within one server lifetime; the first miss is the lowest load "
               "above it that missed, and what it missed. Each probe is a load point of its own: its p99s with their "
               "distribution-free intervals where the SLO was checked (serve.search.level); a probe meets when "
               "every SLO does, judged as serve.search.judge says (point: the p99 as measured; interval: the "
               "interval's upper end).")


# `bench explain`'s culprit searches (orchestrator/explain/), read back from RUN/explain/<cell_id>/explain.json: the
# report's "Why is this cell lossy" section, one block per explained cell, in both formats.
CULPRIT_TITLE = "Why is this cell lossy"
CULPRIT_EXPLANATION = ("`bench explain` re-ran each cell below with its suspects (the engine's declared numerics flags, "
                       "batch size 1, the quantization) moved to the baseline's side: the cell as it is, all moved, each "
                       "alone, then delta debugging over the set. Each probe is a cell of the probe run, judged against "
                       "the baseline re-run beside it; the culprit is the smallest set whose move restores lossless.")


@dataclass
class CulpritLayer:
    results: list[Any]        # orchestrator/store/explain_file.py's ExplainResult, by cell id
    problems: list[str]       # a line per stored result that could not be read
    layers: list[dict[str, Any]] = field(default_factory=list)   # `--layers` reports, each with its rows ("rows")
    mixes: list[Any] = field(default_factory=list)   # `--sensitivity` / `--recipe` per explained cell (panels/mixes.py)


def load_culprits(root: str | Path) -> CulpritLayer | None:
    """The run's stored culprit searches and layer reports; None where `bench explain` never ran on it (no section)."""
    from orchestrator.store.explain_file import read_results
    from orchestrator.store.layers_file import read_all_layers

    from orchestrator.report.panels.mixes import load_mixes

    results, problems = read_results(root)
    reports, damaged = read_all_layers(root)
    layers = [report | {"rows": table.to_pylist()} for report, table in reports]
    mixes = load_mixes(root)
    problems = problems + damaged + [p for e in mixes for p in e.problems]
    return CulpritLayer(results, problems, layers, mixes) if results or problems or reports or mixes else None


LAYERS_EXPLANATION = ("`bench explain --layers` captured the residual stream of each cell below and of its baseline "
                      "on the run's scoring prompts: per capture the relative error against the baseline, beside the "
                      "baseline's own floor (its repeated capture); beyond: more than 2 x the floor + 1e-6.")


def layers_heading(report: dict[str, Any]) -> str:
    return f"layers of {report['cell_id']} against {report.get('baseline_config', '')}"


def layers_summary(report: dict[str, Any]) -> str:
    if report.get("reason"):
        return report["line"]
    return (f"{report['line']} ({report.get('prompts')} prompts, {report.get('positions')} positions; "
            f"floor: {report.get('floor_from', '')})")


def layer_columns() -> list[Column]:
    return [
        ("layer", "layer", lambda r: r["layer"] * 2 + (r.get("part") == "FFN"), lambda r: r["name"], ""),
        ("rel_error", "relative error", lambda r: r["rel_error"], lambda r: num(r["rel_error"], ".3g"), "n"),
        ("floor", "floor", lambda r: r["floor"], lambda r: num(r["floor"], ".3g"), "n"),
        ("growth", "growth", lambda r: r.get("growth"), lambda r: num(r.get("growth"), ".3g"), "n"),
        ("verdict", "beyond the floor", lambda r: r["beyond_floor"], lambda r: "yes" if r["beyond_floor"] else "", ""),
    ]


def culprit_heading(result: Any) -> str:
    return f"{result.config} ({result.verdict}) against {result.baseline_config}"


def culprit_summary(result: Any) -> str:
    """The search's own sentence (what it found), with its outcome, probes, time and probe run."""
    return (f"{result.outcome}: {result.summary} ({len(result.probes)} probes, {result.wall_s:.0f} s; probe run "
            f"{result.probe_run})")


def culprit_columns() -> list[Column]:
    return [
        ("n", "#", lambda r: r["index"], lambda r: str(r["index"]), "n"),
        ("phase", "phase", lambda r: r["phase"], lambda r: r["phase"], ""),
        ("moved", "moved to the baseline's side", lambda r: " + ".join(r["moved"]),
         lambda r: " + ".join(r["moved"]) or "(nothing: the cell as it is)", ""),
        ("verdict", "verdict", lambda r: r.get("verdict") or r["status"],
         lambda r: (r.get("verdict") or "-") if r["status"] == "ok" else r["status"], "verdict"),
        ("max_abs", "max_abs", lambda r: r.get("max_abs"), lambda r: num(r.get("max_abs"), ".3g"), "n"),
        ("kl", "kl_mean", lambda r: r.get("kl_mean"), lambda r: num(r.get("kl_mean"), ".3g"), "n"),
        ("why", "why", lambda r: r.get("verdict_reason") or r.get("reason") or "",
         lambda r: first_line((r.get("verdict_reason") if r["status"] == "ok" else r.get("reason")) or "", 300), "reason"),
    ]
