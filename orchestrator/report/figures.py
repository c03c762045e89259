"""report.html's plotly figures: quality against speed (KL, or a task's score, against the speedup
with its interval, the tolerances, the noise floor, the Pareto frontier and, with --against, each
configuration's move from OLD) and throughput/latency against batch size; and the colours of the
verdict and status words.
"""

from __future__ import annotations

import html
import math
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.matrix.models import Tolerances
from orchestrator.report import data as report_data
from orchestrator.report.compact import speed_text
from orchestrator.report.data import (
    TASK_VERDICT_ORDER,
    VERDICT_ORDER,
    ci_text,
    first_line,
    num,
    p_text,
    pareto_front,
    sci,
)
from orchestrator.values import finite

VERDICT_COLOR = {"identical": "#1a7f37", "lossless": "#4caf50", "near-lossless": "#e6a700", "lossy": "#d73027",
                 "n/a": "#8c8c8c"}


TASK_VERDICT_COLOR = {"regressed": "#d73027", "improved": "#1f77b4", "not distinguishable": "#b8860b",
                      "no change": "#1a7f37", "n/a": "#8c8c8c"}


STATUS_COLOR = {"ok": "#1a7f37", "unsupported": "#b58900", "failed": "#d73027", "crashed": "#d73027",
                "timeout": "#d73027"}


PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
            "#bcbd22", "#17becf", "#393b79", "#ad494a", "#8ca252", "#bd9e39", "#843c39", "#7b4173",
            "#3182bd", "#e6550d", "#31a354", "#756bb1")


def config_colors(names) -> dict[str, str]:
    """One colour per configuration, fixed for a whole page: every panel's trace of a configuration
    is drawn in it (explicitly: plotly's default colourway counts traces per figure, so a panel that
    lacks one configuration would shift every colour after it). Sorted, so a page drawn again from the
    same runs colours them the same."""
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(sorted(set(names)))}


def quality_figure(df: pd.DataFrame, tolerances: Tolerances, against: Any = None, tasks: Any = None) -> tuple[Any, list[str]]:
    """(figure or None, labels of the cells it cannot place on the KL axis). against: a
    report_data.Against, whose moves (each configuration's point in OLD to its point here) are drawn
    as arrows. tasks: a report_data.TaskLayer; with task rows, a dropdown (plotly updatemenus: the page
    stays static) switches the quality axis between KL and each task's score."""
    import plotly.graph_objects as go

    has = df.speedup.map(finite) & df.kl_mean.map(finite)
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


def _kl_view(fig, d: pd.DataFrame, tolerances: Tolerances, against: Any) -> tuple[dict, tuple[float, float]]:
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
        gm = f"{r.greedy_match:.2f}" if finite(r.greedy_match) else "-"
        return (f"<b>{html.escape(r.label)}</b><br>verdict: {r.verdict}<br>speedup: {speed_text(r._asdict(), call=False)}"
                f"<br>KL mean: {kl}<br>greedy match: {gm}<br>noise KL floor: {sci(r.noise_kl_mean) or '-'}"
                f"<br>out tok/s: {num(r.output_tok_s, '.1f')}<br>cell {r.cell_id}"
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
    lines = [(tolerances.kl_lossless, "kl_lossless", "#4caf50"), (tolerances.kl_near, "kl_near", "#e6a700")]
    noise = d.noise_kl_mean[d.noise_kl_mean.map(finite) & (d.noise_kl_mean > 0)]
    if len(noise):
        lines.append((float(noise.max()), "baseline noise floor", "#7f7f7f"))
    for y, name, color in lines:
        if finite(y) and y > 0:   # x: set across the whole axis once every view is drawn (meta "across")
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
    d = d[d.speedup.map(finite) & (d.speedup > 0) & d.get("score", pd.Series(np.nan, index=d.index)).map(finite)]
    if d.empty:
        return None
    d["front"] = pareto_front(d.speedup.to_numpy(), d.score.to_numpy(float), higher_is_better=True)
    metric = ", ".join(sorted(str(m) for m in d.metric.dropna().unique()))

    def hover(r: dict) -> str:
        judged = r["task_verdict"] != "n/a"
        return (f"<b>{html.escape(str(r['label']))}</b><br>{html.escape(task)}: {r['task_verdict']}"
                f"<br>{html.escape(str(r['metric']))}: {ci_text(r, 'score', '.3f')} (n={int(r['n'])})"
                + (f"<br>baseline: {r['base_score']:.3f}; change {ci_text(r, 'change', '+.3f')}, p={p_text(r)}"
                   if judged else f"<br>{html.escape(first_line(r['task_reason'], 120))}")
                + f"<br>speedup: {speed_text(r, call=False)}<br>cell {r['cell_id']}"
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
                 f"{speed_text({'speedup': r.old_speedup, 'speedup_lo': r.old_speedup_lo, 'speedup_hi': r.old_speedup_hi}, call=False)}"
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

    ok = df[(df.status == "ok") & df.output_tok_s.map(finite)].copy()
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
    colors = config_colors(ok.series)
    for series, g in ok.groupby("series", sort=True):
        g = g.sort_values("batch_size")
        color = colors[series]
        for col, (y, p99) in enumerate((("output_tok_s", None), ("ttft_ms_p50", "ttft_ms_p99"),
                                        ("tpot_ms_p50", "tpot_ms_p99")), start=1):
            err = None
            if p99:
                err = dict(type="data", symmetric=False, array=(g[p99] - g[y]).clip(lower=0).fillna(0),
                           arrayminus=[0] * len(g), thickness=1.2, width=4, color=color)
            hover = [f"<b>{html.escape(series)}</b> batch {b}<br>{y}: {num(v, '.4g')}"
                     + (f"<br>{p99}: {num(q, '.4g')}" if p99 else "")
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
