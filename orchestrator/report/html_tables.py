"""report.html's tables and small HTML pieces: the cells table (sortable), the configurations, the
run against OLD, the task tables, perplexity, versions; each column defined once.
"""

from __future__ import annotations

import html
import math
from typing import Any, Callable

import pandas as pd

from orchestrator.report import data as report_data
from orchestrator.report.panels import telemetry as report_telemetry
from orchestrator.report.compact import speed_text
from orchestrator.report.data import (
    TEST_NAMES,
    VERDICT_ORDER,
    against_counts,
    against_rows,
    call_text,
    ci_text,
    first_line,
    is_judged,
    moved_items_text,
    moved_text,
    num,
    p_text,
    q_text,
    ratio_text,
    sci,
    table_cells,
    task_counts,
    task_rows,
    ttft_text,
    why_text,
)
from orchestrator.report.figures import STATUS_COLOR, TASK_VERDICT_COLOR, VERDICT_COLOR
from orchestrator.report.panels.sampling import SAMPLING_VERDICT_COLOR, SAMPLING_VERDICT_ORDER
from orchestrator.store.schema import json_value
from orchestrator.values import as_text, finite


def mib(v: Any) -> str:
    return f"{v / 2**20:.0f}" if finite(v) else ""


def esc(v: Any) -> str:
    return html.escape("" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v))


def fig_html(fig, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                       config={"displaylogo": False, "responsive": True})


# (key, header, tooltip, value for sorting, text shown, css class)
Column = tuple[str, str, str, Callable[[dict], Any], Callable[[dict], str], str]


def _columns(multi_len: bool, with_tasks: bool = False, with_workload: bool = False) -> list[Column]:
    rank = {v: i for i, v in enumerate(VERDICT_ORDER)}
    cols: list[Column] = [
        ("framework", "framework", "", lambda r: r["framework"], lambda r: r["framework"], ""),
        ("model", "model", "", lambda r: r["model"], lambda r: r["model"], ""),
        ("quant", "quant", "quantization", lambda r: r["quantization"], lambda r: r["quantization"], ""),
        ("flags", "flags", "the flag-set name; its options are in the row's tooltip",
         lambda r: r["flags"], lambda r: r["flags"], ""),
    ]
    if with_workload:
        cols.append(("workload", "workload", "the named workload the cell ran (matrix workloads)",
                     lambda r: as_text(r.get("workload")), lambda r: as_text(r.get("workload")), ""))
    cols += [
        ("load", "load", "batch N: an offline static batch; c=N: a served closed loop of N requests in flight; "
         "a served rate: requests/s arriving, at most N in flight", lambda r: f"{r['mode']}:{int(r['batch_size']):06d}:"
         f"{r['request_rate'] if finite(r['request_rate']) else 0:012.3f}", lambda r: r["load_label"], ""),
    ]
    if multi_len:
        cols += [("in", "in", "input tokens", lambda r: r["input_len"], lambda r: str(r["input_len"]), "n"),
                 ("out", "out", "output tokens", lambda r: r["output_len"], lambda r: str(r["output_len"]), "n")]
    cols += [
        ("status", "status", "", lambda r: r["status"], lambda r: r["status"], ""),
        ("verdict", "verdict", "against the baseline, judged with the baseline's noise floor",
         lambda r: rank.get(r["verdict"], 9), lambda r: r["verdict"], "verdict"),
    ]
    if with_tasks:  # the task layer's verdict per cell: the worst of its tasks (the row's tooltip says which)
        trank = {v: i for i, v in enumerate(report_data.TASK_VERDICT_ORDER)}
        cols.append(("tasks", "tasks", "the worst task verdict against the baseline (regressed, improved, no change); "
                     "the task layer below has every task", lambda r: trank.get(r.get("task_verdict")),
                     lambda r: as_text(r.get("task_verdict")), "verdict"))
    cols += [
        ("kl", "KL mean", "KL(baseline || cell) per teacher-forced token", lambda r: r["kl_mean"],
         lambda r: sci(r["kl_mean"]), "n"),
        ("noise-kl", "noise KL", "the baseline engine's own KL floor (run-to-run / batch 1 vs N)",
         lambda r: r["noise_kl_mean"], lambda r: sci(r["noise_kl_mean"]), "n noise"),
        ("max-abs", "max |Δlogprob|", "largest absolute difference of the actual token's logprob",
         lambda r: r["max_abs"], lambda r: sci(r["max_abs"]), "n"),
        ("noise-max-abs", "noise |Δ|", "the baseline engine's own max |Δlogprob|",
         lambda r: r["noise_max_abs"], lambda r: sci(r["noise_max_abs"]), "n noise"),
        ("greedy", "greedy match", "share of prompts whose greedy tokens equal the baseline's",
         lambda r: r["greedy_match"], lambda r: num(r["greedy_match"], ".2f"), "n"),
        ("noise-greedy", "noise greedy", "the baseline engine's own greedy match",
         lambda r: r["noise_greedy_match"], lambda r: num(r["noise_greedy_match"], ".2f"), "n noise"),
        ("ttft-p50", "TTFT p50 ms", "time to first token, as the calling process sees it; ⚑: the engine's own "
         "figure (engine_ttft_ms_p50) is more than 1 ms or 10% away", lambda r: r["ttft_ms_p50"], ttft_text, "n"),
        ("ttft-p99", "TTFT p99 ms", "", lambda r: r["ttft_ms_p99"], lambda r: num(r["ttft_ms_p99"], ".1f"), "n"),
        ("tpot-p50", "TPOT p50 ms", "time per output token after the first", lambda r: r["tpot_ms_p50"],
         lambda r: num(r["tpot_ms_p50"], ".2f"), "n"),
        ("tpot-p99", "TPOT p99 ms", "", lambda r: r["tpot_ms_p99"], lambda r: num(r["tpot_ms_p99"], ".2f"), "n"),
        ("tok-s", "out tok/s", "output tokens/s, mean over the timed batches", lambda r: r["output_tok_s"],
         lambda r: num(r["output_tok_s"], ".1f"), "n"),
        ("errors", "errors", "served requests that failed, of those sent (never dropped)", lambda r: r["errors"],
         lambda r: num(r["errors"], ".0f") if r["mode"] == "serve" else "", "n"),
        ("mem", "peak MiB", "peak memory during the timed batches (the kernel's peak RSS on CPU, nvml on GPU)",
         lambda r: r["peak_mem_bytes"], lambda r: mib(r["peak_mem_bytes"]), "n"),
        ("speedup", "speedup [95% CI] q call",
         "output tokens/s / the baseline cell's; 95% CI: Welch t interval on the log ratio over repeats, or the "
         "paired t ('paired') where the cell's repeats took turns with its baseline's; q: its p adjusted over the "
         "run's speed tests (Benjamini-Hochberg); the call",
         lambda r: r["speedup"], speed_text, "n"),
        ("reason", "reason", "why the verdict (or the status)", why_text, why_text, "reason"),
    ]
    return cols


def cells_table(df: pd.DataFrame) -> str:
    multi_len = df[["input_len", "output_len"]].drop_duplicates().shape[0] > 1
    cols = _columns(multi_len, with_tasks="task_verdict" in df and df.task_verdict.notna().any(),
                    with_workload=report_telemetry.has_workloads(df))
    head = "".join(f'<th data-key="{k}" title="{esc(tip)}">{esc(h)}</th>' for k, h, tip, *_ in cols)
    body = []
    for r in df.to_dict("records"):
        tds = []
        for key, _, _, value, text, cls in cols:
            if "noise" in cls and r["status"] != "ok":  # a cell that did not run has nothing to floor
                tds.append(f'<td class="{cls}" data-v=""></td>')
                continue
            v = value(r)
            v = "" if v is None or (isinstance(v, float) and not math.isfinite(v)) else v
            style = ""
            if key == "verdict":
                style = f' style="color:{VERDICT_COLOR.get(r["verdict"], "#333")}"'
            elif key == "status":
                style = f' style="color:{STATUS_COLOR.get(r["status"], "#333")};font-weight:600"'
            elif key == "tasks":
                style = (f' style="color:{TASK_VERDICT_COLOR.get(r.get("task_verdict"), "#333")}"'
                         f' title="{esc(first_line(r.get("task_reason"), 600))}"')
            tds.append(f'<td class="{cls}" data-v="{esc(v)}"{style}>{esc(text(r))}</td>')
        tip = f"cell {r['cell_id']} · engine {r.get('engine_key')} · flags {r.get('flags_json') or '{}'}"
        body.append(f'<tr title="{esc(tip)}">' + "".join(tds) + "</tr>")
    return (f'<div class="wrap"><table class="sortable" id="cells"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def counts_text(values: pd.Series) -> str:
    return ", ".join(f"{k} {n:,}" for k, n in values.astype(str).value_counts().items())


def bad_groups(bad: pd.DataFrame) -> str:
    """Cells not ok, one line per (status, first line of the reason), most frequent first, capped."""
    why = [first_line(r) or "(no reason given)" for r in bad.reason]
    g = pd.DataFrame({"status": bad.status.astype(str), "why": why, "label": bad.label, "cell": bad.cell_id}) \
        .groupby(["status", "why"], sort=False).agg(n=("cell", "size"), label=("label", "first"), cell=("cell", "first")) \
        .sort_values("n", ascending=False)
    more = len(g) - report_data.MAX_LISTED
    g = g.head(report_data.MAX_LISTED)
    items = "".join(f"<li><b>{n:,}</b> × <span style='color:{STATUS_COLOR.get(st, '#333')}'>{esc(st)}</span>: "
                    f"{esc(why)} <span class='muted'>e.g. {esc(label)}, cell {esc(cell)}</span></li>"
                    for (st, why), n, label, cell in zip(g.index, g.n, g.label, g.cell))
    return f"<ul>{items}</ul>" + (f"<p class='muted'>and {more:,} other reasons (bench show RUN lists every cell)</p>"
                                  if more > 0 else "")


def configs_table(df: pd.DataFrame) -> str:
    """One row per engine config (every cell counted): verdicts, worst KL, best speedups."""
    d = pd.DataFrame({"config": df.config, "verdict": df.verdict.astype(str), "ok": df.status == "ok",
                      "kl": pd.to_numeric(df.kl_mean, errors="coerce"), "speedup": pd.to_numeric(df.speedup, errors="coerce")})
    d["lossless_speedup"] = d.speedup.where(d.verdict.isin(["identical", "lossless"]))
    g = d.groupby("config", sort=False).agg(cells=("ok", "size"), ok=("ok", "sum"), kl_max=("kl", "max"),
                                            best=("speedup", "max"), best_lossless=("lossless_speedup", "max"))
    counts = pd.crosstab(d.config, d.verdict).reindex(columns=list(VERDICT_ORDER), fill_value=0)
    g = g.join(counts).sort_values(["best_lossless", "best"], ascending=False, na_position="last")
    total = len(g)
    g = g.head(report_data.MAX_TABLE_CELLS)
    head = "".join(f'<th data-key="cfg-{k}">{esc(h)}</th>' for k, h in (
        ("config", "engine config"), ("cells", "cells"), ("ok", "ok"), *((v, v) for v in VERDICT_ORDER),
        ("kl", "worst KL mean"), ("best", "best speedup"), ("best-lossless", "best lossless speedup")))
    rows = []
    for cfg, r in zip(g.index, g.to_dict("records")):
        counts = [int(r[v]) for v in VERDICT_ORDER]
        vals = [(cfg, cfg, ""), (int(r["cells"]), f"{int(r['cells']):,}", "n"), (int(r["ok"]), f"{int(r['ok']):,}", "n"),
                *((n, f"{n:,}" if n else "", "n") for n in counts),
                (r["kl_max"], sci(r["kl_max"]), "n"), (r["best"], num(r["best"], ".2f"), "n"),
                (r["best_lossless"], num(r["best_lossless"], ".2f"), "n")]
        rows.append("<tr>" + "".join(f'<td class="{c}" data-v="{esc(v if finite(v) or isinstance(v, str) else "")}">'
                                     f"{esc(t)}</td>" for v, t, c in vals) + "</tr>")
    note = "" if total <= report_data.MAX_TABLE_CELLS else \
        f"<p class='muted'>The {report_data.MAX_TABLE_CELLS:,} of {total:,} engine configs with the best lossless " \
        "speedup.</p>"
    return (note + f'<div class="wrap"><table class="sortable" id="configs"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')


def against_section(ag: Any, fig: Any) -> str:
    """Under the quality plot: what its arrows show and the pairs it does not draw; then one row per
    pair of cells of this run and OLD (compare_runs), and the cells in one run only."""
    parts = []
    if fig is not None and getattr(fig, "_moves_note", ""):
        parts.append(f"<p class='muted'>{esc(fig._moves_note)}</p>")
    elif ag.old_error:
        parts.append(f"<p class='muted'>No arrows from {esc(ag.name)}: its analysis could not run "
                     f"({esc(ag.old_error)}).</p>")
    if ag.not_drawn:
        shown = ag.not_drawn[:report_data.MAX_LISTED]
        more = len(ag.not_drawn) - len(shown)
        parts.append(f"<p class='muted'>No arrow from {esc(ag.name)}: "
                     + esc("; ".join(f"{label} ({why})" for label, why in shown))
                     + (f"; and {more:,} more" if more > 0 else "") + "</p>")
    parts.append(f'<h2 id="against">Against {esc(ag.name)}</h2>')
    if ag.error:
        parts.append(f'<div class="banner">This run could not be compared with {esc(ag.name)}: '
                     f'{esc(ag.error)}</div>')
    if not len(ag.pairs):
        return "\n".join(parts + ["<p class='muted'>No cells to pair.</p>"])
    parts.append(f"<p>{esc(against_counts(ag.pairs, ag.name))}.</p>")
    parts.append(f"<p class='muted'>Each cell of this run against the cell of the same configuration in "
                 f"{esc(ag.name)}: the verdict judges this run's logprobs against {esc(ag.name)}'s with "
                 f"{esc(ag.name)}'s noise floor; ratios are this run ÷ {esc(ag.name)} with the 95% interval "
                 "(Welch t on the log ratio of the two runs' repeats), and the call says faster or slower only "
                 "where the interval excludes 1. Speedup: against each run's own baseline (the plot's arrow). "
                 "What changed: the provenance of the two cells.</p>")
    shown, note = against_rows(ag.pairs)
    if note:
        parts.append(f"<p class='muted'><b>{esc(note)}</b></p>")
    multi_len = ag.pairs[["input_len", "output_len"]].drop_duplicates().shape[0] > 1
    call_color = {"faster": "#1a7f37", "slower": "#d73027"}
    rank = {v: i for i, v in enumerate(VERDICT_ORDER)}

    def ratio(name: str, header: str) -> list[tuple[str, str, Callable, Callable, str]]:
        return [(f"vs-{name}", f"{header} ratio [95% CI]", lambda r: r.get(f"{name}_ratio"), lambda r: ratio_text(r, name),
                 "n"), (f"vs-{name}-call", "call", lambda r: call_text(r, name), lambda r: call_text(r, name), "call")]

    # (key, header, value for sorting, text shown, css class); keys apart from the cells table's (#sort=)
    cols = [("vs-config", "engine config", lambda r: r["config"], lambda r: r["config"], ""),
            ("vs-load", "load", lambda r: f"{r['mode']}:{int(r['batch_size']):06d}:"
             f"{r['request_rate'] if finite(r['request_rate']) else 0:012.3f}", lambda r: r["load_label"], "")]
    if multi_len:
        cols += [("vs-in", "in", lambda r: r["input_len"], lambda r: str(r["input_len"]), "n"),
                 ("vs-out", "out", lambda r: r["output_len"], lambda r: str(r["output_len"]), "n")]
    cols += [("vs-verdict", "verdict", lambda r: rank.get(r["verdict"], 9), lambda r: str(r["verdict"]), "verdict"),
             ("vs-kl", "KL mean", lambda r: r.get("kl_mean"), lambda r: sci(r.get("kl_mean")), "n"),
             ("vs-speedup", "speedup (old → new)", lambda r: r.get("new_speedup"), moved_text, "n")]
    if "task_verdict" in ag.pairs and ag.pairs.task_verdict.notna().any():  # the tasks against OLD, worst of them
        trank = {v: i for i, v in enumerate(report_data.TASK_VERDICT_ORDER)}
        cols.append(("vs-tasks", "tasks", lambda r: trank.get(r.get("task_verdict")),
                     lambda r: as_text(r.get("task_verdict")), "verdict"))
    if "sampling_verdict" in ag.pairs and ag.pairs.sampling_verdict.notna().any():   # the samples against OLD's
        srank = {v: i for i, v in enumerate(SAMPLING_VERDICT_ORDER)}
        cols.append(("vs-sampling", "sampling", lambda r: srank.get(r.get("sampling_verdict")),
                     lambda r: as_text(r.get("sampling_verdict")), "verdict"))
    cols += ratio("tok_s", "out tok/s") + ratio("ttft_p99", "TTFT p99") + ratio("tpot_p50", "TPOT p50")
    cols += [("vs-mem", "peak mem ratio", lambda r: r.get("mem_ratio"),
              lambda r: f"{r['mem_ratio']:.3f}x" if finite(r.get("mem_ratio")) else "", "n"),
             ("vs-reason", "reason", lambda r: as_text(r.get("verdict_reason")), lambda r: as_text(r.get("verdict_reason")),
              "reason"),
             ("vs-changed", "what changed", lambda r: as_text(r.get("changed")), lambda r: as_text(r.get("changed")),
              "reason")]
    head = "".join(f'<th data-key="{k}">{esc(h)}</th>' for k, h, *_ in cols)
    body = []
    for r in shown.to_dict("records"):
        tds = []
        for key, _, value, text, cls in cols:
            v = value(r)
            v = "" if v is None or (isinstance(v, float) and not math.isfinite(v)) else v
            t = text(r)
            style = ""
            if key == "vs-verdict":
                style = f' style="color:{VERDICT_COLOR.get(r["verdict"], "#333")}"'
            elif key == "vs-sampling":
                style = f' style="color:{SAMPLING_VERDICT_COLOR.get(r.get("sampling_verdict"), "#333")}"'
            elif key == "vs-tasks":
                style = (f' style="color:{TASK_VERDICT_COLOR.get(r.get("task_verdict"), "#333")}"'
                         f' title="{esc(first_line(r.get("task_reason"), 600))}"')
            elif cls == "call" and t in call_color:
                style = f' style="color:{call_color[t]};font-weight:600"'
            shown_text = "<br>".join(esc(x) for x in t.split("; ")) if key == "vs-changed" else esc(t)
            tds.append(f'<td class="{cls}" data-v="{esc(v)}"{style}>{shown_text}</td>')
        old_cell = r.get("baseline_cell_id")
        tip = f"cell {r['cell_id']}" + (f" · in {ag.name}: cell {old_cell}" if isinstance(old_cell, str) else "")
        body.append(f'<tr title="{esc(tip)}">' + "".join(tds) + "</tr>")
    parts.append(f'<div class="wrap"><table class="sortable" id="against-cells"><thead><tr>{head}</tr></thead>'
                 f'<tbody>{"".join(body)}</tbody></table></div>')
    return "\n".join(parts)


def _task_table(rows: pd.DataFrame, table_id: str, multi_len: bool) -> str:
    """One task's cells: the score with its 95% CI, the paired change against the baseline with its CI,
    the ratio, the test, p, the items that moved each way and the verdict (coloured)."""
    rank = {v: i for i, v in enumerate(report_data.TASK_VERDICT_ORDER)}
    cols: list[tuple[str, str, Callable, Callable, str]] = [
        ("config", "engine config", lambda r: r.get("config"), lambda r: as_text(r.get("config")), ""),
        ("load", "load", lambda r: f"{r['mode']}:{int(r['batch_size']):06d}:"
         f"{r['request_rate'] if finite(r['request_rate']) else 0:012.3f}", lambda r: as_text(r.get("load_label")), "")]
    if multi_len:
        cols += [("in", "in", lambda r: r["input_len"], lambda r: str(r["input_len"]), "n"),
                 ("out", "out", lambda r: r["output_len"], lambda r: str(r["output_len"]), "n")]
    cols += [("n", "n", lambda r: r.get("n"), lambda r: num(r.get("n"), ".0f"), "n"),
             ("score", "score [95% CI]", lambda r: r.get("score"), lambda r: ci_text(r, "score", ".3f"), "n"),
             ("base", "baseline", lambda r: r.get("base_score") if is_judged(r) else None,
              lambda r: num(r.get("base_score"), ".3f") if is_judged(r) else "", "n"),
             ("change", "change [95% CI]", lambda r: r.get("change") if is_judged(r) else None,
              lambda r: ci_text(r, "change", "+.3f") if is_judged(r) else "", "n"),
             ("ratio", "ratio [95% CI]", lambda r: r.get("ratio") if is_judged(r) else None,
              lambda r: ci_text(r, "ratio", ".3f") if is_judged(r) else "", "n"),
             ("test", "test", lambda r: TEST_NAMES.get(r.get("test"), ""), lambda r: TEST_NAMES.get(r.get("test"), ""), ""),
             ("p", "p", lambda r: r.get("p_value") if is_judged(r) else None, p_text, "n"),
             ("q", "q (p over the run's task tests)", lambda r: r.get("q_value") if is_judged(r) else None, q_text, "n"),
             ("moved", "items worse / better", lambda r: r.get("worse") if is_judged(r) else None, moved_items_text, "n"),
             ("verdict", "verdict", lambda r: rank.get(r.get("task_verdict"), 9), lambda r: as_text(r.get("task_verdict")),
              "verdict"),
             ("reason", "why n/a", lambda r: "" if is_judged(r) else as_text(r.get("task_reason")),
              lambda r: "" if is_judged(r) else as_text(r.get("task_reason")), "reason")]
    def tip(r: dict) -> str:
        base = r.get("baseline_cell_id")
        return f"cell {r['cell_id']}" + (f" · baseline {base}" if isinstance(base, str) else "")

    return sortable(table_id, cols, rows.to_dict("records"),
                     lambda r: TASK_VERDICT_COLOR.get(r.get("task_verdict"), "#333"), tip)


def sortable(table_id: str, cols: list, records: list[dict], verdict_color: Callable, tip: Callable) -> str:
    """A sortable table: cols are (key, header, sort value, shown text, css class); the verdict cell coloured."""
    head = "".join(f'<th data-key="{table_id}-{k}">{esc(h)}</th>' for k, h, *_ in cols)
    body = []
    for r in records:
        tds = []
        for key, _, value, text, cls in cols:
            v = value(r)
            v = "" if v is None or (isinstance(v, float) and not math.isfinite(v)) else v
            style = f' style="color:{verdict_color(r)}"' if key == "verdict" else ""
            tds.append(f'<td class="{cls}" data-v="{esc(v)}"{style}>{esc(text(r))}</td>')
        body.append(f'<tr title="{esc(tip(r))}">' + "".join(tds) + "</tr>")
    return (f'<div class="wrap"><table class="sortable" id="{table_id}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def task_tables(layer: Any, prefix: str) -> list[str]:
    """Per task: a line with n and the cells per verdict, then its table."""
    tv = layer.table
    multi_len = tv[["input_len", "output_len"]].drop_duplicates().shape[0] > 1
    parts = []
    for i, task in enumerate(layer.tasks):
        rows, note = task_rows(tv, task)
        parts.append(f'<h3 id="{prefix}-{i}-head">{esc(task)}</h3><p>{esc(task_counts(tv, task))}.</p>')
        if note:
            parts.append(f"<p class='muted'><b>{esc(note)}</b></p>")
        parts.append(_task_table(rows, f"{prefix}-{i}", multi_len))
    return parts


def ppl_table(df: pd.DataFrame) -> str:
    """Perplexity, the logit layer's task figure: per cell on the scoring text, against the baseline's."""
    shown, _ = table_cells(df)
    d = shown[shown.ppl.map(finite)] if "ppl" in shown else shown.iloc[:0]
    if d.empty:
        return "<p class='muted'>No cell has a perplexity (it needs logprobs of the cell and of its baseline).</p>"
    multi_len = d[["input_len", "output_len"]].drop_duplicates().shape[0] > 1
    rank = {v: i for i, v in enumerate(VERDICT_ORDER)}

    def pct(v: Any) -> str:
        return f"{100 * v:+.3g}%" if finite(v) else ""

    cols = [("config", "engine config", lambda r: r["config"], lambda r: r["config"], ""),
            ("load", "load", lambda r: r["load_label"], lambda r: r["load_label"], "")]
    if multi_len:
        cols += [("in", "in", lambda r: r["input_len"], lambda r: str(r["input_len"]), "n"),
                 ("out", "out", lambda r: r["output_len"], lambda r: str(r["output_len"]), "n")]
    cols += [("ppl", "perplexity", lambda r: r["ppl"], lambda r: num(r["ppl"], ".5g"), "n"),
             ("base", "baseline's", lambda r: r.get("ppl_base"), lambda r: num(r.get("ppl_base"), ".5g"), "n"),
             ("rel", "ppl_rel", lambda r: r.get("ppl_rel"), lambda r: pct(r.get("ppl_rel")), "n"),
             ("noise", "noise |ppl_rel|", lambda r: r.get("noise_ppl_rel"), lambda r: pct(r.get("noise_ppl_rel")),
              "n noise"),
             ("verdict", "logit verdict", lambda r: rank.get(r["verdict"], 9), lambda r: r["verdict"], "verdict")]
    return sortable("ppl", cols, d.to_dict("records"), lambda r: VERDICT_COLOR.get(r["verdict"], "#333"),
                     lambda r: f"cell {r['cell_id']}")


def kv_table(rows: list[tuple[str, Any]]) -> str:
    return '<table class="kv">' + "".join(f"<tr><td>{esc(k)}</td><td>{esc(v)}</td></tr>" for k, v in rows) + "</table>"


def chips(counts: dict[str, int], colors: dict[str, str]) -> str:
    return "".join(f'<span class="chip" style="background:{colors.get(k, "#555")}">{esc(k)}: {n}</span>'
                   for k, n in counts.items() if n)


def versions_rows(df: pd.DataFrame) -> str:
    groups: dict[tuple[str, str], int] = {}
    versions = df["versions"] if "versions" in df else pd.Series([None] * len(df), index=df.index)
    # one parse per distinct versions text, not per cell
    for (fw, v), n in pd.DataFrame({"fw": df.framework.astype(str), "v": versions.astype(object)}) \
            .groupby(["fw", "v"], dropna=False).size().items():
        parsed = json_value(v)
        text = (", ".join(f"{k} {x}" for k, x in sorted(parsed.items())) if isinstance(parsed, dict)
                else str(v) if isinstance(v, str) and v else "")
        key = (str(fw), text or "(not recorded)")
        groups[key] = groups.get(key, 0) + int(n)
    rows = "".join(f"<tr><td>{esc(fw)}</td><td>{esc(text)}</td><td class='n'>{n}</td></tr>"
                   for (fw, text), n in sorted(groups.items()))
    return f"<table><thead><tr><th>framework</th><th>engine-side versions</th><th>cells</th></tr></thead>{rows}</table>"
