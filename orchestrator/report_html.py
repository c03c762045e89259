"""report.html: one self-contained page people read, usable offline (plotly.js inlined once in <head>).

  summary      what ran, status counts, every cell that is not ok with the first line of its
               reason, verdict counts, the fastest lossless cell
  quality vs speed   speedup (with its 95% CI, a Welch t interval on the log ratio) against
               KL(baseline || cell), log axes, one point per cell coloured by verdict, the
               lossless/near tolerances and the baseline's noise floor as lines, and the Pareto
               frontier (cells that no other cell beats on both: higher speedup and lower KL).
               With task rows, a menu on the plot (plotly updatemenus) switches the quality axis to
               a task's score (higher is better, so that frontier maximises both speedup and score)
  against OLD  (`--against OLD_RUN` only) on the quality plot, an arrow per configuration from its
               point in OLD (against OLD's own baseline) to its point here, and under it one row per
               pair of cells (orchestrator/cross_run.py): verdict against OLD, NEW/OLD ratios of
               tok/s, TTFT p99, TPOT p50 with 95% CIs and calls, memory, what changed
  task layer   per task, its cells against the baseline item by item (score with its 95% CI,
               change and ratio with CIs, McNemar exact or paired bootstrap test, p, verdict), a line
               with n and the cells per verdict; with --against, the same against OLD; and perplexity
               per cell, the logit layer's task figure. Without task rows it says so.
  throughput and latency against batch size, one line per engine config: output tokens/s,
               TTFT and TPOT p50 with error bars up to p99
  cells        every cell in one table, sortable by clicking a header (a few lines of inline
               JS; `report.html#sort=speedup` or `#sort=-speedup` opens it sorted), the noise
               floor next to each quality metric the verdict is judged on
  provenance   matrix, sessions, host (CPU, GPUs), the driver's library versions and every
               cell's engine-side `versions`, baseline and tolerances, the matrix as given

A script error in the page shows as a red banner and in the `data-report-errors` attribute of
<html>; `data-plots` on <body> counts the plots that drew (the test reads both from a headless
Chromium). The caps on what one page holds are read as report_data.MAX_* when the page is built.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
from typing import Any, Callable

import numpy as np
import pandas as pd

from orchestrator import report_data, report_sampling, report_searches, report_telemetry
from orchestrator.report_data import (TASK_VERDICT_ORDER, TEST_NAMES, VERDICT_ORDER, _against_counts, _call, _ci,
                                      _finite, _judged, _moved, _moved_items, _num, _p, _ratio, _sci, _speed,
                                      _status_counts, _task_verdict_counts, _text, _ttft, _verdict_counts, _why,
                                      against_rows, first_line, no_tasks_text, pareto_front, table_cells, task_counts,
                                      task_rows)

VERDICT_COLOR = {"identical": "#1a7f37", "lossless": "#4caf50", "near-lossless": "#e6a700", "lossy": "#d73027",
                 "n/a": "#8c8c8c"}
TASK_VERDICT_COLOR = {"regressed": "#d73027", "improved": "#1f77b4", "no change": "#1a7f37", "n/a": "#8c8c8c"}
STATUS_COLOR = {"ok": "#1a7f37", "unsupported": "#b58900", "failed": "#d73027", "crashed": "#d73027",
                "timeout": "#d73027"}
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
            "#bcbd22", "#17becf")


# ------------------------------------------------------------------ formatting

def _mib(v: Any) -> str:
    return f"{v / 2**20:.0f}" if _finite(v) else ""


def _esc(v: Any) -> str:
    return html.escape("" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v))


# ------------------------------------------------------------------ figures

def _fig_html(fig, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                       config={"displaylogo": False, "responsive": True})


def quality_figure(df: pd.DataFrame, tolerances: dict, against: Any = None, tasks: Any = None) -> tuple[Any, list[str]]:
    """(figure or None, labels of the cells it cannot place on the KL axis). against: a
    report_data.Against, whose moves (each configuration's point in OLD to its point here) are drawn
    as arrows. tasks: a report_data.TaskLayer; with task rows, a dropdown (plotly updatemenus: the page
    stays static) switches the quality axis between KL and each task's score."""
    import plotly.graph_objects as go

    has = df.speedup.map(_finite) & df.kl_mean.map(_finite)
    left_out = df.loc[~has, "label"].tolist()
    fig = go.Figure()
    fig._note, fig._moves_note = "", ""
    views = []  # (button label, first trace, end trace, layout of the view, x span of its points)
    if has.any():
        start = len(fig.data)
        layout, span = _kl_view(fig, df[has].copy(), tolerances, against)
        views.append(("quality: KL (logit layer)", start, len(fig.data), layout, span))
    table = tasks.table if tasks is not None and len(tasks.table) else None
    for task in (tasks.tasks if table is not None else []):
        start = len(fig.data)
        view = _task_view(fig, df, table[table.task == task], task)
        if view is not None:
            views.append((f"quality: {task} score", start, len(fig.data), *view))
    if not views:
        return None, left_out
    # one x axis for every view: it spans the CIs too, so no error bar runs off the plot (a bar drawn
    # to the edge reads as a line)
    x_lo, x_hi = min(v[4][0] for v in views), max(v[4][1] for v in views)
    xs = [min(x_lo, 1.0) / 1.5, max(x_hi, 1.0) * 1.5]
    for t in fig.data:
        if getattr(t, "meta", None) == "across":   # the tolerance lines cross the whole axis
            t.x = xs
    fig.update_layout(
        height=560, margin=dict(l=70, r=20, t=50 if len(views) > 1 else 30, b=60), hovermode="closest",
        template="plotly_white", legend=dict(orientation="h", y=-0.15),
        xaxis=dict(title="speedup vs baseline (output tokens/s ratio, 95% CI) — right is faster",
                   type="log", range=[math.log10(xs[0]), math.log10(xs[1])]))
    fig.update_layout({k: v for k, v in views[0][3].items() if k != "annotations"})  # the arrows are in place
    if len(views) > 1:
        for _, start, end, _, _ in views[1:]:
            for t in fig.data[start:end]:
                t.visible = False
        buttons = [dict(label=label, method="update",
                        args=[{"visible": [start <= k < end for k in range(len(fig.data))]}, layout])
                   for label, start, end, layout, _ in views]
        fig.update_layout(updatemenus=[dict(type="dropdown", buttons=buttons, active=0, showactive=True, x=0,
                                            xanchor="left", y=1.02, yanchor="bottom", bgcolor="#f6f8fa")])
    fig._views = [v[0].removeprefix("quality: ") for v in views]
    return fig, left_out


def _x_span(speedup: pd.Series, lo: pd.Series, hi: pd.Series) -> tuple[float, float]:
    x_lo = float(np.nanmin(np.fmin(speedup.to_numpy(float), lo.to_numpy(float))))
    x_hi = float(np.nanmax(np.fmax(speedup.to_numpy(float), hi.to_numpy(float))))
    return (x_lo if x_lo > 0 else float(speedup[speedup > 0].min())), x_hi


def _kl_view(fig, d: pd.DataFrame, tolerances: dict, against: Any) -> tuple[dict, tuple[float, float]]:
    """The logit layer's view: speedup against KL(baseline || cell), coloured by verdict, with the
    tolerances, the noise floor and the frontier (lower KL is better). Returns (its layout, x span)."""
    import plotly.graph_objects as go

    moves = against.moves if against is not None and len(against.moves) else None
    positive = d.kl_mean[d.kl_mean > 0]
    if moves is not None:  # OLD's points share the axes
        positive = pd.concat([positive, moves.old_kl[moves.old_kl > 0]])
    floor = 10 ** math.floor(math.log10(positive.min())) / 10 if len(positive) else 1e-12
    d["kl_plot"] = d.kl_mean.where(d.kl_mean > 0, floor)
    d["front"] = pareto_front(d.speedup.to_numpy(), d.kl_mean.to_numpy())

    def hover(r) -> str:
        kl = "0 (bitwise equal logprobs; drawn at the axis floor)" if r.kl_mean == 0 else f"{r.kl_mean:.3g}"
        gm = f"{r.greedy_match:.2f}" if _finite(r.greedy_match) else "-"
        return (f"<b>{html.escape(r.label)}</b><br>verdict: {r.verdict}<br>speedup: {_speed(r._asdict())}"
                f"<br>KL mean: {kl}<br>greedy match: {gm}<br>noise KL floor: {_sci(r.noise_kl_mean) or '-'}"
                f"<br>out tok/s: {_num(r.output_tok_s, '.1f')}<br>cell {r.cell_id}"
                + ("<br><b>on the Pareto frontier</b>" if r.front else ""))

    dense = len(d) > report_data.MAX_POINTS
    if dense:  # one point per cell would be a page no browser opens: the density of all, and the frontier
        _density(fig, d.speedup, d.kl_plot, "KL", log_y=True)
        fig._note = (f"{len(d):,} cells are too many to draw one by one: the shading counts the cells per "
                     f"(speedup, KL) bin, all {len(d):,} of them; the points are the "
                     f"{int(d.front.sum())} cells on the Pareto frontier, coloured by verdict.")
    for verdict in VERDICT_ORDER:
        g = d[(d.verdict == verdict) & (d.front | (not dense))]
        if g.empty:
            continue
        fig.add_trace(go.Scatter(
            x=g.speedup, y=g.kl_plot, mode="markers", name=verdict,
            marker=dict(color=VERDICT_COLOR[verdict], size=11, line=dict(width=1, color="#333"),
                        symbol=["diamond" if k == 0 else "circle" for k in g.kl_mean]),
            error_x=_x_error(g, VERDICT_COLOR[verdict]), hovertext=[hover(r) for r in g.itertuples()], hoverinfo="text"))
    _frontier(fig, d[d.front], "kl_plot")
    lines = [(tolerances.get("kl_lossless"), "kl_lossless", "#4caf50"), (tolerances.get("kl_near"), "kl_near", "#e6a700")]
    noise = d.noise_kl_mean[d.noise_kl_mean.map(_finite) & (d.noise_kl_mean > 0)]
    if len(noise):
        lines.append((float(noise.max()), "baseline noise floor", "#7f7f7f"))
    for y, name, color in lines:
        if _finite(y) and y > 0:   # x: set across the whole axis once every view is drawn (meta "across")
            fig.add_trace(go.Scatter(x=[1, 1], y=[y, y], mode="lines", name=f"{name} {y:.0e}", hoverinfo="name",
                                     line=dict(color=color, dash="dot", width=1), meta="across"))
    kl_top = float(d.kl_plot.max()) if moves is None else max(float(d.kl_plot.max()), float(moves.old_kl.max()))
    fig.add_trace(go.Scatter(x=[1, 1], y=[floor, max(kl_top, 1e-1) * 3], mode="lines",
                             name="baseline speed (1x)", hoverinfo="name", line=dict(color="#999", width=1)))
    fig._moves_note = _moves(fig, moves, floor, against.name) if moves is not None else ""
    span = _x_span(d.speedup, d.speedup_lo, d.speedup_hi)
    if moves is not None:
        span = (min(span[0], float(moves.old_speedup.min())), max(span[1], float(moves.old_speedup.max())))
    layout = {"yaxis.title.text": "KL(baseline || cell), mean per token — down is closer", "yaxis.type": "log",
              "yaxis.exponentformat": "e", "yaxis.autorange": True,
              # the arrows of --against are drawn on this view only
              "annotations": [a.to_plotly_json() for a in fig.layout.annotations]}
    return layout, span


def _task_view(fig, df: pd.DataFrame, tv: pd.DataFrame, task: str) -> tuple[dict, tuple[float, float]] | None:
    """One task's view: speedup against the task's score (95% CI both ways), coloured by the task
    verdict against the baseline, and the frontier of cells no other is both faster and better at
    (a higher score is better). Returns (its layout, x span), or None when no cell can be placed."""
    import plotly.graph_objects as go

    at = df.drop_duplicates("cell_id").set_index("cell_id")
    d = tv.copy()
    for col in ("speedup", "speedup_lo", "speedup_hi"):
        d[col] = pd.to_numeric(d.cell_id.map(at[col]), errors="coerce")
    d = d[d.speedup.map(_finite) & (d.speedup > 0) & d.get("score", pd.Series(np.nan, index=d.index)).map(_finite)]
    if d.empty:
        return None
    d["front"] = pareto_front(d.speedup.to_numpy(), d.score.to_numpy(float), higher_is_better=True)
    metric = ", ".join(sorted(str(m) for m in d.metric.dropna().unique()))

    def hover(r: dict) -> str:
        judged = r["task_verdict"] != "n/a"
        return (f"<b>{html.escape(str(r['label']))}</b><br>{html.escape(task)}: {r['task_verdict']}"
                f"<br>{html.escape(str(r['metric']))}: {_ci(r, 'score', '.3f')} (n={int(r['n'])})"
                + (f"<br>baseline: {r['base_score']:.3f}; change {_ci(r, 'change', '+.3f')}, p={_p(r)}"
                   if judged else f"<br>{html.escape(first_line(r['task_reason'], 120))}")
                + f"<br>speedup: {_speed(r)}<br>cell {r['cell_id']}"
                + ("<br><b>on the Pareto frontier</b>" if r["front"] else ""))

    dense = len(d) > report_data.MAX_POINTS
    if dense:
        _density(fig, d.speedup, d.score, f"{task} score", log_y=False)
    for verdict in TASK_VERDICT_ORDER:
        g = d[(d.task_verdict == verdict) & (d.front | (not dense))]
        if g.empty:
            continue
        rows = g.to_dict("records")
        fig.add_trace(go.Scatter(
            x=g.speedup, y=g.score, mode="markers", name=f"{task}: {verdict}",
            marker=dict(color=TASK_VERDICT_COLOR[verdict], size=11, line=dict(width=1, color="#333")),
            error_x=_x_error(g, TASK_VERDICT_COLOR[verdict]),
            error_y=dict(type="data", symmetric=False, array=(g.score_hi - g.score).fillna(0).clip(lower=0),
                         arrayminus=(g.score - g.score_lo).fillna(0).clip(lower=0), thickness=1, width=3,
                         color=TASK_VERDICT_COLOR[verdict]),
            hovertext=[hover(r) for r in rows], hoverinfo="text"))
    _frontier(fig, d[d.front], "score")
    y_lo = float(np.nanmin(np.fmin(d.score, d.score_lo))) if d.score_lo.notna().any() else float(d.score.min())
    y_hi = float(np.nanmax(np.fmax(d.score, d.score_hi))) if d.score_hi.notna().any() else float(d.score.max())
    fig.add_trace(go.Scatter(x=[1, 1], y=[y_lo, y_hi], mode="lines", name="baseline speed (1x)",
                             hoverinfo="name", line=dict(color="#999", width=1)))
    layout = {"yaxis.title.text": f"{task}: {metric} per cell (95% CI) — up is better", "yaxis.type": "linear",
              "yaxis.exponentformat": "none", "yaxis.autorange": True, "annotations": []}
    return layout, _x_span(d.speedup, d.speedup_lo, d.speedup_hi)


def _x_error(g: pd.DataFrame, color: str) -> dict:
    return dict(type="data", symmetric=False, array=(g.speedup_hi - g.speedup).fillna(0).clip(lower=0),
                arrayminus=(g.speedup - g.speedup_lo).fillna(0).clip(lower=0), thickness=1, width=3, color=color)


def _frontier(fig, front: pd.DataFrame, y: str) -> None:
    """The Pareto frontier as a step line through its points, fastest last. A vertical-then-horizontal
    step bounds the dominated region for either direction of the quality axis."""
    import plotly.graph_objects as go

    front = front.sort_values("speedup")
    fig.add_trace(go.Scatter(x=front.speedup, y=front[y], mode="lines+markers", name="Pareto frontier",
                             line=dict(color="#444", dash="dash", width=1.5, shape="vh"),
                             marker=dict(size=17, color="rgba(0,0,0,0)", line=dict(color="#444", width=1.5)),
                             hovertext=[f"Pareto frontier: {html.escape(str(l))}" for l in front.label],
                             hoverinfo="text"))


def _moves(fig, moves: pd.DataFrame, floor: float, old_name: str) -> str:
    """Each configuration's move from OLD to this run: a hollow marker at its OLD point (hover for
    both) and an arrow from there to its point here; at most report_data.MAX_ARROWS, the longest.
    Returns what the page says about them."""
    import plotly.graph_objects as go

    m = moves.copy()
    m["ox"], m["nx"] = np.log10(m.old_speedup.to_numpy(float)), np.log10(m.new_speedup.to_numpy(float))
    m["oy"] = np.log10(m.old_kl.where(m.old_kl > 0, floor).to_numpy(float))
    m["ny"] = np.log10(m.new_kl.where(m.new_kl > 0, floor).to_numpy(float))
    m["length"] = np.hypot(m.nx - m.ox, m.ny - m.oy)
    still = int((m.length < 1e-9).sum())   # the same point in both runs (a baseline cell: 1x, KL 0)
    m = m[m.length >= 1e-9]
    capped = len(m) > report_data.MAX_ARROWS
    if capped:
        m = m.nlargest(report_data.MAX_ARROWS, "length", keep="first").sort_index()
    if len(m):
        def kl(v) -> str:
            return "0" if v == 0 else f"{v:.3g}"

        hover = [f"<b>{html.escape(r.label)}</b><br>in {html.escape(old_name)}: speedup "
                 f"{_speed({'speedup': r.old_speedup, 'speedup_lo': r.old_speedup_lo, 'speedup_hi': r.old_speedup_hi})}"
                 f", KL {kl(r.old_kl)}, {r.old_verdict}<br>here: speedup {r.new_speedup:.2f}x, KL {kl(r.new_kl)}, "
                 f"{r.new_verdict}<br>cell {r.new_cell}" for r in m.itertuples()]
        fig.add_trace(go.Scatter(
            x=m.old_speedup, y=10 ** m.oy, mode="markers", name=f"in {old_name} (arrow: to this run)",
            marker=dict(size=9, color="rgba(0,0,0,0)", line=dict(width=1.5, color=[VERDICT_COLOR.get(v, "#555")
                                                                                  for v in m.old_verdict])),
            hovertext=hover, hoverinfo="text"))
        # on log axes an annotation's x/y (and ax/ay in axis units) are log10 values; rounded, as
        # plotly.js has misplaced annotations given every digit of a float (plotly.js#7569)
        fig.update_layout(annotations=[dict(x=round(r.nx, 6), y=round(r.ny, 6), ax=round(r.ox, 6),
                                            ay=round(r.oy, 6), xref="x", yref="y", axref="x",
                                            ayref="y", text="", showarrow=True, arrowhead=2, arrowsize=1.2,
                                            arrowwidth=1.4, arrowcolor="#555", standoff=6, startstandoff=4)
                                       for r in m.itertuples()])
    note = (f"Arrows: {len(m):,} configuration(s) from their point in {old_name} (hollow markers: speedup and KL "
            f"against {old_name}'s own baseline) to their point in this run" if len(m) else
            f"No configuration moved between {old_name} and this run")
    if capped:
        note += f", the {report_data.MAX_ARROWS:,} longest of {len(moves) - still:,} moves"
    if still:
        note += f"; {still:,} at the same point in both runs (no arrow)"
    return note + "."


def _density(fig, speedup: pd.Series, y: pd.Series, name: str, log_y: bool) -> None:
    """A 2-D histogram of (speedup, quality) on log x (and log y for KL), computed here: the page holds
    the counts only."""
    import plotly.graph_objects as go

    x = np.log10(speedup.clip(lower=1e-9).to_numpy(float))
    yv = np.log10(y.to_numpy(float)) if log_y else y.to_numpy(float)
    counts, xe, ye = np.histogram2d(x, yv, bins=(90, 70))
    z = np.where(counts.T > 0, counts.T, np.nan)
    mid = (ye[:-1] + ye[1:]) / 2
    fig.add_trace(go.Heatmap(x=10 ** ((xe[:-1] + xe[1:]) / 2), y=10 ** mid if log_y else mid, z=z,
                             colorscale="Blues", zmin=0, name="cells per bin", colorbar=dict(title="cells", x=1.02),
                             hovertemplate=f"speedup %{{x:.3g}}, {html.escape(name)} %{{y:.2g}}: %{{z}} cells"
                                           "<extra></extra>"))


def speed_figure(df: pd.DataFrame) -> Any:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    ok = df[(df.status == "ok") & df.output_tok_s.map(_finite)].copy()
    if ok.empty:
        return None
    multi_len = ok[["input_len", "output_len"]].drop_duplicates().shape[0] > 1
    # a served open-loop rate is its own series (x: the concurrency cap), apart from the closed loop
    rate = [f" {a} {r:g}/s" if m == "serve" and r != np.inf else "" for m, r, a in zip(ok["mode"], ok.request_rate, ok.load)]
    ok["series"] = ok.config + rate + [f" in{i}/out{o}" if multi_len else "" for i, o in zip(ok.input_len, ok.output_len)]
    n_series, note = ok.series.nunique(), ""
    if n_series > report_data.MAX_SERIES:  # thousands of lines help nobody: the fastest configs
        top = ok.groupby("series").output_tok_s.max().nlargest(report_data.MAX_SERIES).index
        ok = ok[ok.series.isin(top)]
        note = (f"Showing the {report_data.MAX_SERIES} of {n_series:,} engine configs with the highest "
                f"output tokens/s (at their best batch size); the others are in the tables.")
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.07, subplot_titles=(
        "output tokens/s", "TTFT ms (p50, bar to p99)", "TPOT ms (p50, bar to p99)"))
    for n, (series, g) in enumerate(ok.groupby("series", sort=True)):
        g = g.sort_values("batch_size")
        color = _PALETTE[n % len(_PALETTE)]
        for col, (y, p99) in enumerate((("output_tok_s", None), ("ttft_ms_p50", "ttft_ms_p99"),
                                        ("tpot_ms_p50", "tpot_ms_p99")), start=1):
            err = None
            if p99:
                err = dict(type="data", symmetric=False, array=(g[p99] - g[y]).clip(lower=0).fillna(0),
                           arrayminus=[0] * len(g), thickness=1.2, width=4)
            hover = [f"<b>{html.escape(series)}</b> batch {b}<br>{y}: {_num(v, '.4g')}"
                     + (f"<br>{p99}: {_num(q, '.4g')}" if p99 else "")
                     + (" (batches ran sequentially)" if m == "sequential" else "")
                     for b, v, q, m in zip(g.batch_size, g[y], g[p99] if p99 else g[y], g.batch_mode)]
            fig.add_trace(go.Scatter(x=g.batch_size, y=g[y], mode="lines+markers", name=series, legendgroup=series,
                                     showlegend=col == 1, line=dict(color=color), marker=dict(color=color, size=8),
                                     error_y=err, hovertext=hover, hoverinfo="text"), row=1, col=col)
    batches = sorted(int(b) for b in ok.batch_size.unique())
    fig.update_xaxes(type="log", tickvals=batches, ticktext=[str(b) for b in batches],
                     title_text="batch size (serve: requests in flight)")
    fig.update_yaxes(type="log", rangemode="tozero")
    fig.update_layout(height=470, margin=dict(l=60, r=20, t=40, b=40), template="plotly_white", hovermode="closest",
                      legend=dict(orientation="h", y=-0.22))
    fig._note = note
    return fig


# ------------------------------------------------------------------ html

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1500px;
     padding:0 20px;color:#1f2328}
h1{font-size:24px;margin:0 0 4px} h2{font-size:19px;margin:28px 0 8px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
.muted{color:#656d76} .chip{display:inline-block;padding:2px 9px;border-radius:10px;color:#fff;margin:2px 4px 2px 0;
     font-weight:600;font-size:13px}
table{border-collapse:collapse;font-size:13px} td,th{padding:3px 6px;border-bottom:1px solid #e6e8eb;text-align:left;vertical-align:top}
th{background:#f6f8fa;position:sticky;top:0;font-size:12.5px}
table.sortable th{cursor:pointer;user-select:none} table.sortable th:hover{background:#eaeef2}
th[aria-sort=ascending]::after{content:" ▲"} th[aria-sort=descending]::after{content:" ▼"}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap} .wrap{overflow-x:auto;max-height:80vh}
td.noise{color:#656d76;background:#fafbfc} .verdict{font-weight:600;white-space:nowrap}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(380px,1fr));gap:8px 28px}
.kv td:first-child{color:#656d76;white-space:nowrap} .bad{color:#d73027} .banner{background:#ffebe9;border:1px solid #d73027;
     padding:8px 12px;border-radius:6px;margin:8px 0} pre{background:#f6f8fa;padding:10px;overflow-x:auto}
.reason{min-width:260px;max-width:420px}
"""

# Before plotly.js: any script error becomes a visible banner and an attribute a test can read.
_ERRORS_JS = """
window.reportErrors = [];
window.addEventListener('error', function (e) {
  var msg = String(e.message || e.type) + (e.filename ? ' (' + e.filename.split('/').pop() + ':' + e.lineno + ')' : '');
  window.reportErrors.push(msg);
  document.documentElement.setAttribute('data-report-errors', window.reportErrors.join(' | '));
  var b = document.getElementById('script-errors');
  if (b) { b.style.display = 'block'; b.textContent = 'Script errors in this page: ' + window.reportErrors.join(' | '); }
});
"""

# Click a header to sort by it (again: the other way); blanks always last; numbers by data-v.
_SORT_JS = """
function sortTable(th, asc) {
  var table = th.closest('table'), i = Array.prototype.indexOf.call(th.parentNode.children, th);
  table.querySelectorAll('th').forEach(function (h) { h.removeAttribute('aria-sort'); });
  th.setAttribute('aria-sort', asc ? 'ascending' : 'descending');
  var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
  function key(r) { var c = r.cells[i], v = c.getAttribute('data-v'); return v === null ? c.textContent.trim() : v; }
  rows.sort(function (a, b) {
    var x = key(a), y = key(b);
    if (x === '' || y === '') return (x === '') - (y === '');
    var nx = Number(x), ny = Number(y);
    var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y, undefined, {numeric: true});
    return asc ? c : -c;
  });
  rows.forEach(function (r) { body.appendChild(r); });
}
document.querySelectorAll('table.sortable th').forEach(function (th) {
  th.addEventListener('click', function () { sortTable(th, th.getAttribute('aria-sort') !== 'ascending'); });
});
(function () {
  var m = /^#sort=(-?)([\\w-]+)$/.exec(location.hash);
  var th = m && document.querySelector('table.sortable th[data-key="' + m[2] + '"]');
  if (th) sortTable(th, m[1] !== '-');
})();
document.body.setAttribute('data-plots', Array.prototype.filter.call(document.querySelectorAll('.js-plotly-plot'),
  function (d) { return d.querySelector('.main-svg'); }).length);
"""

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
                     lambda r: _text(r.get("workload")), lambda r: _text(r.get("workload")), ""))
    cols += [
        ("load", "load", "batch N: an offline static batch; c=N: a served closed loop of N requests in flight; "
         "a served rate: requests/s arriving, at most N in flight", lambda r: f"{r['mode']}:{int(r['batch_size']):06d}:"
         f"{r['request_rate'] if _finite(r['request_rate']) else 0:012.3f}", lambda r: r["load_label"], ""),
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
                     lambda r: _text(r.get("task_verdict")), "verdict"))
    cols += [
        ("kl", "KL mean", "KL(baseline || cell) per teacher-forced token", lambda r: r["kl_mean"],
         lambda r: _sci(r["kl_mean"]), "n"),
        ("noise-kl", "noise KL", "the baseline engine's own KL floor (run-to-run / batch 1 vs N)",
         lambda r: r["noise_kl_mean"], lambda r: _sci(r["noise_kl_mean"]), "n noise"),
        ("max-abs", "max |Δlogprob|", "largest absolute difference of the actual token's logprob",
         lambda r: r["max_abs"], lambda r: _sci(r["max_abs"]), "n"),
        ("noise-max-abs", "noise |Δ|", "the baseline engine's own max |Δlogprob|",
         lambda r: r["noise_max_abs"], lambda r: _sci(r["noise_max_abs"]), "n noise"),
        ("greedy", "greedy match", "share of prompts whose greedy tokens equal the baseline's",
         lambda r: r["greedy_match"], lambda r: _num(r["greedy_match"], ".2f"), "n"),
        ("noise-greedy", "noise greedy", "the baseline engine's own greedy match",
         lambda r: r["noise_greedy_match"], lambda r: _num(r["noise_greedy_match"], ".2f"), "n noise"),
        ("ttft-p50", "TTFT p50 ms", "time to first token, as the calling process sees it; ⚑: the engine's own "
         "figure (engine_ttft_ms_p50) is more than 1 ms or 10% away", lambda r: r["ttft_ms_p50"], _ttft, "n"),
        ("ttft-p99", "TTFT p99 ms", "", lambda r: r["ttft_ms_p99"], lambda r: _num(r["ttft_ms_p99"], ".1f"), "n"),
        ("tpot-p50", "TPOT p50 ms", "time per output token after the first", lambda r: r["tpot_ms_p50"],
         lambda r: _num(r["tpot_ms_p50"], ".2f"), "n"),
        ("tpot-p99", "TPOT p99 ms", "", lambda r: r["tpot_ms_p99"], lambda r: _num(r["tpot_ms_p99"], ".2f"), "n"),
        ("tok-s", "out tok/s", "output tokens/s, mean over the timed batches", lambda r: r["output_tok_s"],
         lambda r: _num(r["output_tok_s"], ".1f"), "n"),
        ("errors", "errors", "served requests that failed, of those sent (never dropped)", lambda r: r["errors"],
         lambda r: _num(r["errors"], ".0f") if r["mode"] == "serve" else "", "n"),
        ("mem", "peak MiB", "peak memory during the timed batches (the kernel's peak RSS on CPU, nvml on GPU)",
         lambda r: r["peak_mem_bytes"], lambda r: _mib(r["peak_mem_bytes"]), "n"),
        ("speedup", "speedup [95% CI]",
         "output tokens/s / the baseline cell's; 95% CI: Welch t interval on the log ratio over repeats",
         lambda r: r["speedup"], _speed, "n"),
        ("reason", "reason", "why the verdict (or the status)", _why, _why, "reason"),
    ]
    return cols


def _cells_table(df: pd.DataFrame) -> str:
    multi_len = df[["input_len", "output_len"]].drop_duplicates().shape[0] > 1
    cols = _columns(multi_len, with_tasks="task_verdict" in df and df.task_verdict.notna().any(),
                    with_workload=report_telemetry.has_workloads(df))
    head = "".join(f'<th data-key="{k}" title="{_esc(tip)}">{_esc(h)}</th>' for k, h, tip, *_ in cols)
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
                         f' title="{_esc(first_line(r.get("task_reason"), 600))}"')
            tds.append(f'<td class="{cls}" data-v="{_esc(v)}"{style}>{_esc(text(r))}</td>')
        tip = f"cell {r['cell_id']} · engine {r.get('engine_key')} · flags {r.get('flags_json') or '{}'}"
        body.append(f'<tr title="{_esc(tip)}">' + "".join(tds) + "</tr>")
    return (f'<div class="wrap"><table class="sortable" id="cells"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def _counts(values: pd.Series) -> str:
    return ", ".join(f"{k} {n:,}" for k, n in values.astype(str).value_counts().items())


def _bad_groups(bad: pd.DataFrame) -> str:
    """Cells not ok, one line per (status, first line of the reason), most frequent first, capped."""
    why = [first_line(r) or "(no reason given)" for r in bad.status_reason]
    g = pd.DataFrame({"status": bad.status.astype(str), "why": why, "label": bad.label, "cell": bad.cell_id}) \
        .groupby(["status", "why"], sort=False).agg(n=("cell", "size"), label=("label", "first"), cell=("cell", "first")) \
        .sort_values("n", ascending=False)
    more = len(g) - report_data.MAX_LISTED
    g = g.head(report_data.MAX_LISTED)
    items = "".join(f"<li><b>{n:,}</b> × <span style='color:{STATUS_COLOR.get(st, '#333')}'>{_esc(st)}</span>: "
                    f"{_esc(why)} <span class='muted'>e.g. {_esc(label)}, cell {_esc(cell)}</span></li>"
                    for (st, why), n, label, cell in zip(g.index, g.n, g.label, g.cell))
    return f"<ul>{items}</ul>" + (f"<p class='muted'>and {more:,} other reasons (bench show RUN lists every cell)</p>"
                                  if more > 0 else "")


def _configs_table(df: pd.DataFrame) -> str:
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
    head = "".join(f'<th data-key="cfg-{k}">{_esc(h)}</th>' for k, h in (
        ("config", "engine config"), ("cells", "cells"), ("ok", "ok"), *((v, v) for v in VERDICT_ORDER),
        ("kl", "worst KL mean"), ("best", "best speedup"), ("best-lossless", "best lossless speedup")))
    rows = []
    for cfg, r in zip(g.index, g.to_dict("records")):
        counts = [int(r[v]) for v in VERDICT_ORDER]
        vals = [(cfg, cfg, ""), (int(r["cells"]), f"{int(r['cells']):,}", "n"), (int(r["ok"]), f"{int(r['ok']):,}", "n"),
                *((n, f"{n:,}" if n else "", "n") for n in counts),
                (r["kl_max"], _sci(r["kl_max"]), "n"), (r["best"], _num(r["best"], ".2f"), "n"),
                (r["best_lossless"], _num(r["best_lossless"], ".2f"), "n")]
        rows.append("<tr>" + "".join(f'<td class="{c}" data-v="{_esc(v if _finite(v) or isinstance(v, str) else "")}">'
                                     f"{_esc(t)}</td>" for v, t, c in vals) + "</tr>")
    note = "" if total <= report_data.MAX_TABLE_CELLS else \
        f"<p class='muted'>The {report_data.MAX_TABLE_CELLS:,} of {total:,} engine configs with the best lossless " \
        "speedup.</p>"
    return (note + f'<div class="wrap"><table class="sortable" id="configs"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')


def _against_section(ag: Any, fig: Any) -> str:
    """Under the quality plot: what its arrows show and the pairs it does not draw; then one row per
    pair of cells of this run and OLD (compare_runs), and the cells in one run only."""
    parts = []
    if fig is not None and getattr(fig, "_moves_note", ""):
        parts.append(f"<p class='muted'>{_esc(fig._moves_note)}</p>")
    elif ag.old_error:
        parts.append(f"<p class='muted'>No arrows from {_esc(ag.name)}: its analysis could not run "
                     f"({_esc(ag.old_error)}).</p>")
    if ag.not_drawn:
        shown = ag.not_drawn[:report_data.MAX_LISTED]
        more = len(ag.not_drawn) - len(shown)
        parts.append(f"<p class='muted'>No arrow from {_esc(ag.name)}: "
                     + _esc("; ".join(f"{label} ({why})" for label, why in shown))
                     + (f"; and {more:,} more" if more > 0 else "") + "</p>")
    parts.append(f'<h2 id="against">Against {_esc(ag.name)}</h2>')
    if ag.error:
        parts.append(f'<div class="banner">This run could not be compared with {_esc(ag.name)}: '
                     f'{_esc(ag.error)}</div>')
    if not len(ag.pairs):
        return "\n".join(parts + ["<p class='muted'>No cells to pair.</p>"])
    parts.append(f"<p>{_esc(_against_counts(ag.pairs, ag.name))}.</p>")
    parts.append(f"<p class='muted'>Each cell of this run against the cell of the same configuration in "
                 f"{_esc(ag.name)}: the verdict judges this run's logprobs against {_esc(ag.name)}'s with "
                 f"{_esc(ag.name)}'s noise floor; ratios are this run ÷ {_esc(ag.name)} with the 95% interval "
                 "(Welch t on the log ratio of the two runs' repeats), and the call says faster or slower only "
                 "where the interval excludes 1. Speedup: against each run's own baseline (the plot's arrow). "
                 "What changed: the provenance of the two cells.</p>")
    shown, note = against_rows(ag.pairs)
    if note:
        parts.append(f"<p class='muted'><b>{_esc(note)}</b></p>")
    multi_len = ag.pairs[["input_len", "output_len"]].drop_duplicates().shape[0] > 1
    call_color = {"faster": "#1a7f37", "slower": "#d73027"}
    rank = {v: i for i, v in enumerate(VERDICT_ORDER)}

    def ratio(name: str, header: str) -> list[tuple[str, str, Callable, Callable, str]]:
        return [(f"vs-{name}", f"{header} ratio [95% CI]", lambda r: r.get(f"{name}_ratio"), lambda r: _ratio(r, name),
                 "n"), (f"vs-{name}-call", "call", lambda r: _call(r, name), lambda r: _call(r, name), "call")]

    # (key, header, value for sorting, text shown, css class); keys apart from the cells table's (#sort=)
    cols = [("vs-config", "engine config", lambda r: r["config"], lambda r: r["config"], ""),
            ("vs-load", "load", lambda r: f"{r['mode']}:{int(r['batch_size']):06d}:"
             f"{r['request_rate'] if _finite(r['request_rate']) else 0:012.3f}", lambda r: r["load_label"], "")]
    if multi_len:
        cols += [("vs-in", "in", lambda r: r["input_len"], lambda r: str(r["input_len"]), "n"),
                 ("vs-out", "out", lambda r: r["output_len"], lambda r: str(r["output_len"]), "n")]
    cols += [("vs-verdict", "verdict", lambda r: rank.get(r["verdict"], 9), lambda r: str(r["verdict"]), "verdict"),
             ("vs-kl", "KL mean", lambda r: r.get("kl_mean"), lambda r: _sci(r.get("kl_mean")), "n"),
             ("vs-speedup", "speedup (old → new)", lambda r: r.get("new_speedup"), _moved, "n")]
    if "task_verdict" in ag.pairs and ag.pairs.task_verdict.notna().any():  # the tasks against OLD, worst of them
        trank = {v: i for i, v in enumerate(report_data.TASK_VERDICT_ORDER)}
        cols.append(("vs-tasks", "tasks", lambda r: trank.get(r.get("task_verdict")),
                     lambda r: _text(r.get("task_verdict")), "verdict"))
    cols += ratio("tok_s", "out tok/s") + ratio("ttft_p99", "TTFT p99") + ratio("tpot_p50", "TPOT p50")
    cols += [("vs-mem", "peak mem ratio", lambda r: r.get("mem_ratio"),
              lambda r: f"{r['mem_ratio']:.3f}x" if _finite(r.get("mem_ratio")) else "", "n"),
             ("vs-reason", "reason", lambda r: _text(r.get("reason")), lambda r: _text(r.get("reason")), "reason"),
             ("vs-changed", "what changed", lambda r: _text(r.get("changed")), lambda r: _text(r.get("changed")),
              "reason")]
    head = "".join(f'<th data-key="{k}">{_esc(h)}</th>' for k, h, *_ in cols)
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
            elif key == "vs-tasks":
                style = (f' style="color:{TASK_VERDICT_COLOR.get(r.get("task_verdict"), "#333")}"'
                         f' title="{_esc(first_line(r.get("task_reason"), 600))}"')
            elif cls == "call" and t in call_color:
                style = f' style="color:{call_color[t]};font-weight:600"'
            shown_text = "<br>".join(_esc(x) for x in t.split("; ")) if key == "vs-changed" else _esc(t)
            tds.append(f'<td class="{cls}" data-v="{_esc(v)}"{style}>{shown_text}</td>')
        old_cell = r.get("baseline_cell_id")
        tip = f"cell {r['cell_id']}" + (f" · in {ag.name}: cell {old_cell}" if isinstance(old_cell, str) else "")
        body.append(f'<tr title="{_esc(tip)}">' + "".join(tds) + "</tr>")
    parts.append(f'<div class="wrap"><table class="sortable" id="against-cells"><thead><tr>{head}</tr></thead>'
                 f'<tbody>{"".join(body)}</tbody></table></div>')
    return "\n".join(parts)


def _task_table(rows: pd.DataFrame, table_id: str, multi_len: bool) -> str:
    """One task's cells: the score with its 95% CI, the paired change against the baseline with its CI,
    the ratio, the test, p, the items that moved each way and the verdict (coloured)."""
    rank = {v: i for i, v in enumerate(report_data.TASK_VERDICT_ORDER)}
    cols: list[tuple[str, str, Callable, Callable, str]] = [
        ("config", "engine config", lambda r: r.get("config"), lambda r: _text(r.get("config")), ""),
        ("load", "load", lambda r: f"{r['mode']}:{int(r['batch_size']):06d}:"
         f"{r['request_rate'] if _finite(r['request_rate']) else 0:012.3f}", lambda r: _text(r.get("load_label")), "")]
    if multi_len:
        cols += [("in", "in", lambda r: r["input_len"], lambda r: str(r["input_len"]), "n"),
                 ("out", "out", lambda r: r["output_len"], lambda r: str(r["output_len"]), "n")]
    cols += [("n", "n", lambda r: r.get("n"), lambda r: _num(r.get("n"), ".0f"), "n"),
             ("score", "score [95% CI]", lambda r: r.get("score"), lambda r: _ci(r, "score", ".3f"), "n"),
             ("base", "baseline", lambda r: r.get("base_score") if _judged(r) else None,
              lambda r: _num(r.get("base_score"), ".3f") if _judged(r) else "", "n"),
             ("change", "change [95% CI]", lambda r: r.get("change") if _judged(r) else None,
              lambda r: _ci(r, "change", "+.3f") if _judged(r) else "", "n"),
             ("ratio", "ratio [95% CI]", lambda r: r.get("ratio") if _judged(r) else None,
              lambda r: _ci(r, "ratio", ".3f") if _judged(r) else "", "n"),
             ("test", "test", lambda r: TEST_NAMES.get(r.get("test"), ""), lambda r: TEST_NAMES.get(r.get("test"), ""), ""),
             ("p", "p", lambda r: r.get("p_value") if _judged(r) else None, _p, "n"),
             ("moved", "items worse / better", lambda r: r.get("worse") if _judged(r) else None, _moved_items, "n"),
             ("verdict", "verdict", lambda r: rank.get(r.get("task_verdict"), 9), lambda r: _text(r.get("task_verdict")),
              "verdict"),
             ("reason", "why n/a", lambda r: "" if _judged(r) else _text(r.get("task_reason")),
              lambda r: "" if _judged(r) else _text(r.get("task_reason")), "reason")]
    def tip(r: dict) -> str:
        base = r.get("baseline_cell_id")
        return f"cell {r['cell_id']}" + (f" · baseline {base}" if isinstance(base, str) else "")

    return _sortable(table_id, cols, rows.to_dict("records"),
                     lambda r: TASK_VERDICT_COLOR.get(r.get("task_verdict"), "#333"), tip)


def _sortable(table_id: str, cols: list, records: list[dict], verdict_color: Callable, tip: Callable) -> str:
    """A sortable table: cols are (key, header, sort value, shown text, css class); the verdict cell coloured."""
    head = "".join(f'<th data-key="{table_id}-{k}">{_esc(h)}</th>' for k, h, *_ in cols)
    body = []
    for r in records:
        tds = []
        for key, _, value, text, cls in cols:
            v = value(r)
            v = "" if v is None or (isinstance(v, float) and not math.isfinite(v)) else v
            style = f' style="color:{verdict_color(r)}"' if key == "verdict" else ""
            tds.append(f'<td class="{cls}" data-v="{_esc(v)}"{style}>{_esc(text(r))}</td>')
        body.append(f'<tr title="{_esc(tip(r))}">' + "".join(tds) + "</tr>")
    return (f'<div class="wrap"><table class="sortable" id="{table_id}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def _task_tables(layer: Any, prefix: str) -> list[str]:
    """Per task: a line with n and the cells per verdict, then its table."""
    tv = layer.table
    multi_len = tv[["input_len", "output_len"]].drop_duplicates().shape[0] > 1
    parts = []
    for i, task in enumerate(layer.tasks):
        rows, note = task_rows(tv, task)
        parts.append(f'<h3 id="{prefix}-{i}-head">{_esc(task)}</h3><p>{_esc(task_counts(tv, task))}.</p>')
        if note:
            parts.append(f"<p class='muted'><b>{_esc(note)}</b></p>")
        parts.append(_task_table(rows, f"{prefix}-{i}", multi_len))
    return parts


def _ppl_table(df: pd.DataFrame) -> str:
    """Perplexity, the logit layer's task figure: per cell on the scoring text, against the baseline's."""
    shown, _ = table_cells(df)
    d = shown[shown.ppl.map(_finite)] if "ppl" in shown else shown.iloc[:0]
    if d.empty:
        return "<p class='muted'>No cell has a perplexity (it needs logprobs of the cell and of its baseline).</p>"
    multi_len = d[["input_len", "output_len"]].drop_duplicates().shape[0] > 1
    rank = {v: i for i, v in enumerate(VERDICT_ORDER)}

    def pct(v: Any) -> str:
        return f"{100 * v:+.3g}%" if _finite(v) else ""

    cols = [("config", "engine config", lambda r: r["config"], lambda r: r["config"], ""),
            ("load", "load", lambda r: r["load_label"], lambda r: r["load_label"], "")]
    if multi_len:
        cols += [("in", "in", lambda r: r["input_len"], lambda r: str(r["input_len"]), "n"),
                 ("out", "out", lambda r: r["output_len"], lambda r: str(r["output_len"]), "n")]
    cols += [("ppl", "perplexity", lambda r: r["ppl"], lambda r: _num(r["ppl"], ".5g"), "n"),
             ("base", "baseline's", lambda r: r.get("ppl_base"), lambda r: _num(r.get("ppl_base"), ".5g"), "n"),
             ("rel", "ppl_rel", lambda r: r.get("ppl_rel"), lambda r: pct(r.get("ppl_rel")), "n"),
             ("noise", "noise |ppl_rel|", lambda r: r.get("noise_ppl_rel"), lambda r: pct(r.get("noise_ppl_rel")),
              "n noise"),
             ("verdict", "logit verdict", lambda r: rank.get(r["verdict"], 9), lambda r: r["verdict"], "verdict")]
    return _sortable("ppl", cols, d.to_dict("records"), lambda r: VERDICT_COLOR.get(r["verdict"], "#333"),
                     lambda r: f"cell {r['cell_id']}")


def _task_panel(tasks: Any, df: pd.DataFrame, manifest: dict, against: Any = None) -> str:
    """The task layer: per task its cells against the baseline, item by item (orchestrator/task_verdicts.py);
    with --against, per task each cell against its partner in OLD; and perplexity, the logit layer's
    task figure, per cell."""
    alpha = ((manifest.get("matrix") or {}).get("tolerances") or {}).get("task_alpha", 0.05)
    parts = ['<h2 id="tasks">Task layer</h2>']
    if tasks is not None and tasks.error:
        parts.append(f'<div class="banner">The task analysis could not run: {_esc(tasks.error)}</div>')
    elif tasks is None or not len(tasks.table):
        parts.append(f"<p class='muted' id='no-tasks'>{_esc(no_tasks_text(manifest))}</p>")
    else:
        parts.append(f"<div>cells {_chips(_task_verdict_counts(df), TASK_VERDICT_COLOR)}</div>")
        parts.append("<p class='muted'>Each cell's task sets, scored item by item and paired with its baseline "
                     "cell's same items. Score: the metric's mean with its 95% CI (Wilson for 0/1 metrics, else a "
                     "bootstrap). Change (cell − baseline) and ratio (cell ÷ baseline, MLPerf's accuracy ratio): "
                     "paired bootstrap 95% CIs. Test: McNemar's exact test on the items that flipped (0/1 metrics), "
                     f"else a paired bootstrap test; regressed or improved where p &lt; {_esc(alpha)} (task_alpha), "
                     "else no change. The quality plot above can show each task's score on its quality axis.</p>")
        parts += _task_tables(tasks, "task")
    vs = against.tasks if against is not None else None
    if vs is not None and (vs.error or len(vs.table)):
        parts.append(f'<h3 id="tasks-against">Tasks against {_esc(against.name)}</h3>')
        if vs.error:
            parts.append(f"<p class='muted'>No task comparison with {_esc(against.name)}: {_esc(vs.error)}</p>")
        else:
            parts.append(f"<p class='muted'>Each cell of this run against its partner in {_esc(against.name)}, "
                         "item by item, with the same tests: the baseline column is the partner's score.</p>")
            parts += _task_tables(vs, "vs-task")
    parts.append('<h3 id="perplexity">Perplexity (logit layer)</h3>'
                 "<p class='muted'>Per cell on the scoring text (teacher forced, the positions the cell and its "
                 "baseline both scored): the cell's perplexity, the baseline's, and ppl_rel = ppl ÷ baseline's − 1 "
                 "next to the baseline engine's own |ppl_rel| noise; the logit verdict weighs it with the other "
                 "logit metrics.</p>" + _ppl_table(df))
    return "\n".join(parts)


def _sampling_panel(layer: Any, df: pd.DataFrame, manifest: dict) -> str:
    """The sampling layer: per cell with samples, seed by seed and both distribution tests
    (orchestrator/report_sampling.py defines the columns, shared with report.md)."""
    parts = ['<h2 id="sampling">Sampling layer</h2>']
    recs = report_sampling.rows(layer, df)
    if layer.error:
        parts.append(f'<div class="banner">The sampling analysis could not run: {_esc(layer.error)}</div>')
    elif not recs:
        parts.append(f"<p class='muted' id='no-sampling'>{_esc(report_sampling.no_sampling_text(manifest))}</p>")
    else:
        counts = pd.Series([r.get("sampling_verdict") or "n/a" for r in recs]).value_counts().to_dict()
        parts.append(f"<div>cells {_chips(counts, report_sampling.SAMPLING_VERDICT_COLOR)}</div>")
        parts.append(f"<p class='muted'>{_esc(report_sampling.explanation(layer))}</p>")
        parts.append(_sortable("sampling-table", report_sampling.columns(), recs,
                               lambda r: report_sampling.SAMPLING_VERDICT_COLOR.get(r.get("sampling_verdict"), "#333"),
                               report_sampling.why))
    return "\n".join(parts)


def _telemetry_panel(df: pd.DataFrame) -> str:
    """Engine telemetry and energy per ok cell, the prefix-cache hit rate beside TTFT, and why a figure is
    empty (orchestrator/report_telemetry.py defines the columns, shared with report.md)."""
    parts = ['<h2 id="telemetry">Engine telemetry and energy</h2>']
    recs, note = report_telemetry.rows(df)
    if not recs:
        return parts[0] + "<p class='muted' id='no-telemetry'>No cell ran ok: nothing was measured.</p>"
    if note:
        parts.append(f"<p class='muted'><b>{_esc(note)}</b></p>")
    parts.append(f"<p class='muted'>{_esc(report_telemetry.EXPLANATION)}</p>")
    if report_telemetry.measured(recs):
        cols = report_telemetry.columns(report_telemetry.has_workloads(df))
        parts.append(_sortable("telemetry-table", cols, recs, lambda r: "#333",
                               lambda r: f"cell {r['cell_id']}"))
    else:
        parts.append("<p class='muted' id='no-telemetry'>No cell measured any of these figures.</p>")
    why = report_telemetry.not_measured(recs)
    if why:
        shown = why[:report_data.MAX_LISTED]
        more = f"<li>… and {len(why) - len(shown)} more reasons</li>" if len(why) > len(shown) else ""
        parts.append("<details id='telemetry-missing'><summary>Not measured, and why</summary><ul>"
                     + "".join(f"<li>{_esc(w)}</li>" for w in shown) + more + "</ul></details>")
    return "\n".join(parts)


def _search_panel(layer: Any) -> str:
    """SLO searches: per configuration the highest load meeting every SLO, then every probe
    (orchestrator/report_searches.py defines the columns, shared with report.md)."""
    parts = ['<h2 id="searches">SLO search</h2>']
    if layer.error:
        return parts[0] + f'<div class="banner">The searches could not be read: {_esc(layer.error)}</div>'
    parts.append(f"<p class='muted'>{_esc(report_searches.EXPLANATION)}</p>")
    parts.append(_sortable("search-table", report_searches.summary_columns(layer.probes),
                           layer.summaries.to_dict("records"),
                           lambda r: "#333", lambda r: f"search {r['cell_id']}"))
    if len(layer.probes):
        parts.append("<h3>Probes</h3>")
        parts.append(_sortable("probe-table", report_searches.probe_columns(), layer.probes.to_dict("records"),
                               lambda r: "#1a7f37" if r.get("search_meets") else "#d73027",
                               lambda r: f"probe {r['cell_id']} of search {r['search_id']}"))
    return "\n".join(parts)


def _kv(rows: list[tuple[str, Any]]) -> str:
    return '<table class="kv">' + "".join(f"<tr><td>{_esc(k)}</td><td>{_esc(v)}</td></tr>" for k, v in rows) + "</table>"


def _chips(counts: dict[str, int], colors: dict[str, str]) -> str:
    return "".join(f'<span class="chip" style="background:{colors.get(k, "#555")}">{_esc(k)}: {n}</span>'
                   for k, n in counts.items() if n)


def _fastest(df: pd.DataFrame, verdicts: tuple[str, ...]) -> dict | None:
    d = df[df.verdict.isin(verdicts) & df.speedup.map(_finite)]
    return None if d.empty else d.loc[d.speedup.idxmax()].to_dict()


def _versions_rows(df: pd.DataFrame) -> str:
    groups: dict[tuple[str, str], int] = {}
    versions = df["versions"] if "versions" in df else pd.Series([None] * len(df), index=df.index)
    # one parse per distinct versions text, not per cell
    for (fw, v), n in pd.DataFrame({"fw": df.framework.astype(str), "v": versions.astype(object)}) \
            .groupby(["fw", "v"], dropna=False).size().items():
        try:
            text = ", ".join(f"{k} {x}" for k, x in sorted(json.loads(v).items())) if isinstance(v, str) and v else ""
        except ValueError:
            text = str(v)
        key = (str(fw), text or "(not recorded)")
        groups[key] = groups.get(key, 0) + int(n)
    rows = "".join(f"<tr><td>{_esc(fw)}</td><td>{_esc(text)}</td><td class='n'>{n}</td></tr>"
                   for (fw, text), n in sorted(groups.items()))
    return f"<table><thead><tr><th>framework</th><th>engine-side versions</th><th>cells</th></tr></thead>{rows}</table>"


def _duration(s: dict) -> str:
    try:
        a, b = (_dt.datetime.fromisoformat(s[k]) for k in ("started", "ended"))
        return f"{(b - a).total_seconds() / 60:.1f} min"
    except (KeyError, TypeError, ValueError):
        return "not ended (running, or killed)"


def render_html(df: pd.DataFrame, manifest: dict, run_name: str, analysis_error: str | None = None,
                against: Any = None, tasks: Any = None, sampling: Any = None, searches: Any = None) -> str:
    """The page; against (a report_data.Against) adds the moves from OLD to the quality plot and the
    section with this run against OLD; tasks (a report_data.TaskLayer) the task quality axes and panel;
    searches (a report_searches.SearchLayer) the SLO-search panel."""
    import plotly
    import plotly.offline

    matrix = manifest.get("matrix") or {}
    tolerances = matrix.get("tolerances") or {}
    baseline = matrix.get("baseline") or {}
    host = manifest.get("host") or {}
    status_counts, verdict_counts = _status_counts(df), _verdict_counts(df)
    bad = df[df.status != "ok"]

    parts = [f"<h1>{_esc(run_name)}</h1>",
             f'<div class="muted">matrix <b>{_esc(matrix.get("name", "?"))}</b> · {len(df)} cells · '
             f'baseline {_esc(", ".join(f"{k}={v}" for k, v in baseline.items()) or "-")} · generated '
             f'{_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}</div>',
             '<div id="script-errors" class="banner" style="display:none"></div>']
    if analysis_error:
        parts.append(f'<div class="banner">The analysis could not run, so verdicts, KL and speedups are empty: '
                     f'{_esc(analysis_error)}</div>')

    # summary
    parts.append("<h2>Summary</h2>")
    parts.append(f"<div>status {_chips(status_counts, STATUS_COLOR)}</div>")
    parts.append(f"<div>verdict {_chips(verdict_counts, VERDICT_COLOR)}</div>")
    if tasks is not None and len(tasks.table):
        parts.append(f"<div>tasks {_chips(_task_verdict_counts(df), TASK_VERDICT_COLOR)}</div>")
    lines, seen = [], set()
    for name, verdicts in (("Fastest lossless (identical or lossless)", ("identical", "lossless")),
                           ("Fastest near-lossless or better", ("identical", "lossless", "near-lossless"))):
        r = _fastest(df, verdicts)
        if r and r["cell_id"] not in seen:
            seen.add(r["cell_id"])
            lines.append(f"<li>{name}: <b>{_esc(r['label'])}</b> — {_esc(_speed(r))}, {_esc(r['verdict'])}</li>")
    if lines:
        parts.append("<ul>" + "".join(lines) + "</ul>")
    if len(bad) > report_data.MAX_LISTED:
        parts.append(f"<p class='bad'><b>{len(bad):,} of {len(df):,} cells did not run ok</b>, grouped by status and "
                     f"the first line of the reason:</p>" + _bad_groups(bad))
    elif len(bad):
        items = "".join(f"<li><b>{_esc(r['label'])}</b> <span style='color:{STATUS_COLOR.get(r['status'], '#333')}'>"
                        f"{_esc(r['status'])}</span>: {_esc(first_line(r.get('status_reason')) or '(no reason given)')}"
                        f" <span class='muted'>cell {_esc(r['cell_id'])}</span></li>"
                        for r in bad.to_dict("records"))
        parts.append(f"<p class='bad'><b>{len(bad)} of {len(df)} cells did not run ok:</b></p><ul>{items}</ul>")
    else:
        parts.append(f"<p>All {len(df)} cells ran ok.</p>" if len(df) else "<p>No cells are stored in this run.</p>")

    # quality vs speed
    parts.append("<h2>Quality vs speed</h2>")
    fig, left_out = quality_figure(df, tolerances, against, tasks)
    if fig is not None:
        parts.append(_fig_html(fig, "plot-quality"))
        parts.append("<p class='muted'>One point per cell (hover for details). Speedup = the cell's output tokens/s "
                     "÷ its baseline cell's (same batch size where one was measured), with its 95% CI "
                     "(Welch t interval on the log ratio of the per-repeat throughputs). "
                     "Diamonds: KL exactly 0 (bitwise-equal logprobs), drawn at the axis floor. The dashed step line "
                     "is the Pareto frontier: cells no other cell beats on both speed and KL.</p>")
        if len(fig._views) > 1:
            parts.append(f"<p class='muted' id='quality-axes'>Quality axis (the menu above the plot): "
                         f"{_esc(', '.join(fig._views))}. On a task's axis a point is the cell's score with its 95% CI, "
                         "coloured by its task verdict against the baseline; higher is better, so there the frontier "
                         "holds the cells no other cell beats on both speed and score.</p>")
    else:
        parts.append("<p class='muted'>No cell has both a speedup and a KL to place.</p>")
    if fig is not None and fig._note:
        parts.append(f"<p class='muted'><b>{_esc(fig._note)}</b></p>")
    if len(left_out) > report_data.MAX_LISTED:
        parts.append(f"<p class='muted'>Not placed (no KL or no speedup, see their verdict reason): {len(left_out):,} "
                     f"cells; by verdict: {_esc(_counts(df.verdict[~(df.speedup.map(_finite) & df.kl_mean.map(_finite))]))}</p>")
    elif left_out:
        parts.append(f"<p class='muted'>Not placed (no KL or no speedup, see their verdict reason): "
                     f"{_esc(', '.join(left_out))}</p>")
    if against is not None:
        parts.append(_against_section(against, fig))
    parts.append(_task_panel(tasks, df, manifest, against))
    if sampling is not None:
        parts.append(_sampling_panel(sampling, df, manifest))
    parts.append(_telemetry_panel(df))
    if searches is not None:
        parts.append(_search_panel(searches))

    # throughput and latency
    parts.append("<h2>Throughput and latency vs batch size</h2>")
    sfig = speed_figure(df)
    if sfig is not None:
        parts.append(_fig_html(sfig, "plot-speed"))
        parts.append("<p class='muted'>One line per engine config (framework/model/quantization/flags); "
                     "latency markers are p50, the error bar reaches p99. Click a legend entry to hide a config."
                     + (f" <b>{_esc(sfig._note)}</b>" if sfig._note else "") + "</p>")
    else:
        parts.append("<p class='muted'>No ok cell to plot.</p>")

    # cells
    parts.append("<h2>Cells</h2><p class='muted'>Click a header to sort. Grey columns: the noise floor "
                 "(the baseline engine against itself, run to run and batch 1 vs N) next to the metric it floors; "
                 "a deviation within it counts as lossless. Hover a row for its cell id and flags.</p>")
    shown, note = table_cells(df)
    if note:
        parts.append(f"<p class='muted'><b>{_esc(note)}</b></p>")
        parts.append("<h3>Engine configs</h3>" + _configs_table(df))
    parts.append(_cells_table(shown))

    # provenance
    gpus = host.get("gpus") or []
    gpu_text = "; ".join(f"{g.get('name')} ({(g.get('memory_bytes') or 0) / 2**30:.0f} GiB, driver {g.get('driver')})"
                         for g in gpus) or "none (CPU run)"
    mem = host.get("memory_bytes")
    host_rows = [("CPU", f"{host.get('cpu', '?')} × {host.get('cpu_count', '?')}"), ("GPUs", gpu_text),
                 ("memory", f"{mem / 2**30:.1f} GiB" if _finite(mem) else "?"), ("OS", host.get("os", "?")),
                 ("machine", host.get("machine", "?")), ("Python", host.get("python", "?"))]
    sessions = manifest.get("sessions") or []
    sess = "".join(f"<tr><td>{_esc(s.get('started'))}</td><td>{_esc(s.get('ended') or '-')}</td>"
                   f"<td>{_esc(_duration(s))}</td></tr>" for s in sessions)
    drivers = sorted((manifest.get("driver_versions") or {}).items())
    parts.append("<h2>Provenance</h2><div class='grid'>")
    parts.append("<div><h3>Run</h3>" + _kv([("run", run_name), ("run_id", manifest.get("run_id", "?")),
                                              ("matrix", matrix.get("name", "?")),
                                              ("schema version", manifest.get("schema_version", "?")),
                                              ("cells planned / stored", f"{len(manifest.get('cells') or [])} / {len(df)}"),
                                              ("workload", json.dumps(matrix.get("workloads")
                                                                      or matrix.get("workload") or {})),
                                              ("baseline", json.dumps(baseline)),
                                              ("tolerances", json.dumps(tolerances))])
                 + f"<h3>Sessions</h3><table><thead><tr><th>started</th><th>ended</th><th>took</th></tr></thead>{sess}</table></div>")
    parts.append("<div><h3>Host</h3>" + _kv(host_rows) + "<h3>Driver (orchestrator) versions</h3>" + _kv(drivers) + "</div>")
    parts.append("</div><h3>Engine versions per cell</h3>" + _versions_rows(df))
    if manifest.get("matrix_text"):
        parts.append(f"<details><summary>The matrix as given</summary><pre>{_esc(manifest['matrix_text'])}</pre></details>")
    parts.append(f"<p class='muted'>lossless-bench report · plotly {plotly.__version__} inlined; works offline.</p>")

    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{_esc(run_name)} — lossless-bench</title>"
            f"<style>{_CSS}</style><script>{_ERRORS_JS}</script>"
            f"<script type='text/javascript'>{plotly.offline.get_plotlyjs()}</script></head><body>"
            + "\n".join(parts) + f"<script>{_SORT_JS}</script></body></html>")
