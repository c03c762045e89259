"""`bench report RUN`: one self-contained HTML file people read, and a Markdown summary for PRs.

    report.html   usable offline: plotly.js is inlined once in <head> (no CDN, no network)
      summary      what ran, status counts, every cell that is not ok with the first line of its
                   reason, verdict counts, the fastest lossless cell
      quality vs speed   speedup (with its 95% CI, a Welch t interval on the log ratio) against
                   KL(baseline || cell), log axes, one point per cell coloured by verdict, the
                   lossless/near tolerances and the baseline's noise floor as lines, and the Pareto
                   frontier (cells that no other cell beats on both: higher speedup and lower KL)
      throughput and latency against batch size, one line per engine config: output tokens/s,
                   TTFT and TPOT p50 with error bars up to p99
      cells        every cell in one table, sortable by clicking a header (a few lines of inline
                   JS; `report.html#sort=speedup` or `#sort=-speedup` opens it sorted), the noise
                   floor next to each quality metric the verdict is judged on
      provenance   matrix, sessions, host (CPU, GPUs), the driver's library versions and every
                   cell's engine-side `versions`, baseline and tolerances, the matrix as given
    report.md     status counts, the verdict/speedup table, the cells that are not ok

Numbers come from `orchestrator.analysis.analyse` (verdicts, KL, noise floors, speedups) and the
stored cells table (versions). When the analysis cannot run, the report still renders the speed
numbers and says why the quality columns are empty. A script error in the page shows as a red
banner and in the `data-report-errors` attribute of <html>; `data-plots` on <body> counts the
plots that drew (the test reads both from a headless Chromium).
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from orchestrator.cells import load_label
from orchestrator.store import STATUSES, RunStore

VERDICT_ORDER = ("identical", "lossless", "near-lossless", "lossy", "n/a")
VERDICT_COLOR = {"identical": "#1a7f37", "lossless": "#4caf50", "near-lossless": "#e6a700", "lossy": "#d73027",
                 "n/a": "#8c8c8c"}
STATUS_COLOR = {"ok": "#1a7f37", "unsupported": "#b58900", "failed": "#d73027", "crashed": "#d73027",
                "timeout": "#d73027"}
_METRICS = ("verdict", "reason", "kl_mean", "max_abs", "greedy_match", "greedy_close", "top1", "ppl_rel",
            "noise_kl_mean", "noise_max_abs", "noise_greedy_match", "speedup", "speedup_lo", "speedup_hi",
            "baseline_cell_id", "baseline_match")
# What one HTML page holds and a browser still opens: a larger run is aggregated or capped, and
# the page says so (the numbers of every cell: `bench compare RUN -o cells.parquet`, `bench export`).
MAX_POINTS = 2000       # quality-vs-speed: above this, a density of all cells plus the Pareto frontier
MAX_SERIES = 24         # throughput/latency lines: the engine configs with the highest throughput
MAX_TABLE_CELLS = 2000  # cells table (and report.md): the Pareto frontier, then the fastest cells
MAX_LISTED = 50         # cells not ok, cells not placed: listed one by one up to this, else grouped
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
            "#bcbd22", "#17becf")


# ------------------------------------------------------------------ data

def _finite(v: Any) -> bool:
    return isinstance(v, (int, float, np.number)) and not isinstance(v, bool) and math.isfinite(v)


def first_line(text: Any, limit: int = 200) -> str:
    if not isinstance(text, str):
        return ""
    line = next((s.strip() for s in text.splitlines() if s.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def load(run_dir: str | Path) -> tuple[pd.DataFrame, dict, str | None]:
    """(one row per cell: stored columns + analysis columns, manifest, why the analysis failed or None)."""
    store = RunStore(run_dir)
    manifest = store.read_manifest()
    raw = store.read_cells()
    analysis_error = None
    try:
        from orchestrator.analysis import analyse

        df = analyse(store.root)
        extra = [c for c in raw.columns if c not in df.columns or c == "cell_id"]
        df = df.merge(raw[extra], on="cell_id", how="left")
    except Exception as e:  # the report must still show the speed numbers
        analysis_error = f"{type(e).__name__}: {first_line(str(e), 400)}"
        df = raw.rename(columns={"reason": "status_reason"})
        df["verdict"], df["reason"] = "n/a", "analysis unavailable"
    for col in _METRICS:
        if col not in df.columns:
            df[col] = "n/a" if col == "verdict" else np.nan
    if "status_reason" not in df.columns:
        df["status_reason"] = None
    df = df.sort_values(["framework", "model", "quantization", "flags", "batch_size", "input_len", "output_len"],
                        ignore_index=True)
    # column-wise, not a row-wise join (that alone took 18 s at 100k cells)
    df["config"] = (df["framework"].astype(str) + "/" + df["model"].astype(str) + "/"
                    + df["quantization"].astype(str) + "/" + df["flags"].astype(str)) if len(df) else ""
    df["config"] += np.where(df["mode"] == "serve", "/serve", "") if len(df) else ""
    df["load_label"] = [load_label(m, b, r, a) for m, b, r, a in zip(df["mode"], df.batch_size, df.request_rate, df.load)]
    multi_len = df[["input_len", "output_len"]].drop_duplicates().shape[0] > 1
    df["label"] = [f"{c} {lo}" + (f" in{i}/out{o}" if multi_len else "")
                   for c, lo, i, o in zip(df.config, df.load_label, df.input_len, df.output_len)]
    return df, manifest, analysis_error


def pareto_front(speedup: np.ndarray, kl: np.ndarray) -> np.ndarray:
    """Mask of the points no other point dominates (speedup >= and kl <=, one of them strictly)."""
    speedup, kl = np.asarray(speedup, dtype=float), np.asarray(kl, dtype=float)
    on = np.zeros(len(speedup), dtype=bool)
    best_kl, best_s = math.inf, math.nan
    for i in np.lexsort((kl, -speedup)):  # fastest first; equal speed: lowest KL first
        if kl[i] < best_kl:
            on[i], best_kl, best_s = True, kl[i], speedup[i]
        elif kl[i] == best_kl and speedup[i] == best_s:  # an exact tie with a frontier point
            on[i] = True
    return on


# ------------------------------------------------------------------ formatting

def _num(v: Any, spec: str = ".3g") -> str:
    return format(v, spec) if _finite(v) else ""


def _sci(v: Any) -> str:
    if not _finite(v):
        return ""
    return "0" if v == 0 else (f"{v:.3g}" if 1e-2 <= abs(v) < 1e4 else f"{v:.2e}")


def _speed(r: dict) -> str:
    if not _finite(r["speedup"]):
        return ""
    ci = f" [{_num(r['speedup_lo'], '.2f')}, {_num(r['speedup_hi'], '.2f')}]" if _finite(r["speedup_lo"]) else ""
    return f"{r['speedup']:.2f}x{ci}"


def _ttft_disagrees(r: dict) -> bool:
    """Our TTFT and the engine's own differ by more than the contract's margin (1 ms or 10%)."""
    v = r.get("engine_ttft_agrees")
    return v is not None and not pd.isna(v) and not bool(v)


def _ttft(r: dict) -> str:
    return _num(r["ttft_ms_p50"], ".1f") + (" ⚑" if _ttft_disagrees(r) else "")


def _mib(v: Any) -> str:
    return f"{v / 2**20:.0f}" if _finite(v) else ""


def _esc(v: Any) -> str:
    return html.escape("" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v))


def _why(r: dict) -> str:
    if r["status"] != "ok":
        return first_line(r.get("status_reason")) or str(r["status"])
    return str(r["reason"]) if isinstance(r["reason"], str) else ""


# ------------------------------------------------------------------ figures

def _fig_html(fig, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                       config={"displaylogo": False, "responsive": True})


def quality_figure(df: pd.DataFrame, tolerances: dict) -> tuple[Any, list[str]]:
    """(figure or None, labels of the cells it cannot place)."""
    import plotly.graph_objects as go

    has = df.speedup.map(_finite) & df.kl_mean.map(_finite)
    left_out = df.loc[~has, "label"].tolist()
    d = df[has].copy()
    if d.empty:
        return None, left_out
    positive = d.kl_mean[d.kl_mean > 0]
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

    fig = go.Figure()
    dense = len(d) > MAX_POINTS
    fig._note = ""
    if dense:  # one point per cell would be a page no browser opens: the density of all, and the frontier
        _density(fig, d)
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
            error_x=dict(type="data", symmetric=False, array=(g.speedup_hi - g.speedup).fillna(0).clip(lower=0),
                         arrayminus=(g.speedup - g.speedup_lo).fillna(0).clip(lower=0), thickness=1, width=3,
                         color=VERDICT_COLOR[verdict]),
            hovertext=[hover(r) for r in g.itertuples()], hoverinfo="text"))
    front = d[d.front].sort_values("speedup")
    fig.add_trace(go.Scatter(x=front.speedup, y=front.kl_plot, mode="lines+markers", name="Pareto frontier",
                             line=dict(color="#444", dash="dash", width=1.5, shape="vh"),
                             marker=dict(size=17, color="rgba(0,0,0,0)", line=dict(color="#444", width=1.5)),
                             hovertext=[f"Pareto frontier: {html.escape(l)}" for l in front.label], hoverinfo="text"))
    # the axis spans the CIs too, so no error bar runs off the plot (a bar drawn to the edge reads as a line)
    x_lo = float(np.nanmin(np.fmin(d.speedup.to_numpy(float), d.speedup_lo.to_numpy(float))))
    x_hi = float(np.nanmax(np.fmax(d.speedup.to_numpy(float), d.speedup_hi.to_numpy(float))))
    x_lo = x_lo if x_lo > 0 else float(d.speedup[d.speedup > 0].min())
    xs = [min(x_lo, 1.0) / 1.5, max(x_hi, 1.0) * 1.5]
    lines = [(tolerances.get("kl_lossless"), "kl_lossless", "#4caf50"), (tolerances.get("kl_near"), "kl_near", "#e6a700")]
    noise = d.noise_kl_mean[d.noise_kl_mean.map(_finite) & (d.noise_kl_mean > 0)]
    if len(noise):
        lines.append((float(noise.max()), "baseline noise floor", "#7f7f7f"))
    for y, name, color in lines:
        if _finite(y) and y > 0:
            fig.add_trace(go.Scatter(x=xs, y=[y, y], mode="lines", name=f"{name} {y:.0e}", hoverinfo="name",
                                     line=dict(color=color, dash="dot", width=1)))
    fig.add_trace(go.Scatter(x=[1, 1], y=[floor, max(float(d.kl_plot.max()), 1e-1) * 3], mode="lines",
                             name="baseline speed (1x)", hoverinfo="name", line=dict(color="#999", width=1)))
    fig.update_layout(
        height=560, margin=dict(l=70, r=20, t=30, b=60), hovermode="closest", template="plotly_white",
        legend=dict(orientation="h", y=-0.15),
        xaxis=dict(title="speedup vs baseline (output tokens/s ratio, 95% CI) — right is faster",
                   type="log", range=[math.log10(xs[0]), math.log10(xs[1])]),
        yaxis=dict(title="KL(baseline || cell), mean per token — down is closer", type="log", exponentformat="e"))
    return fig, left_out


def _density(fig, d: pd.DataFrame) -> None:
    """A 2-D histogram of (speedup, KL) on log axes, computed here: the page holds the counts only."""
    import plotly.graph_objects as go

    x, y = np.log10(d.speedup.clip(lower=1e-9).to_numpy(float)), np.log10(d.kl_plot.to_numpy(float))
    counts, xe, ye = np.histogram2d(x, y, bins=(90, 70))
    z = np.where(counts.T > 0, counts.T, np.nan)
    fig.add_trace(go.Heatmap(x=10 ** ((xe[:-1] + xe[1:]) / 2), y=10 ** ((ye[:-1] + ye[1:]) / 2), z=z,
                             colorscale="Blues", zmin=0, name="cells per bin", colorbar=dict(title="cells", x=1.02),
                             hovertemplate="speedup %{x:.3g}, KL %{y:.2g}: %{z} cells<extra></extra>"))


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
    if n_series > MAX_SERIES:  # thousands of lines help nobody: the fastest configs
        top = ok.groupby("series").output_tok_s.max().nlargest(MAX_SERIES).index
        ok = ok[ok.series.isin(top)]
        note = (f"Showing the {MAX_SERIES} of {n_series:,} engine configs with the highest output tokens/s "
                f"(at their best batch size); the others are in the tables.")
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
td.noise{color:#656d76;background:#fafbfc} .verdict{font-weight:600}
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


def _columns(multi_len: bool) -> list[Column]:
    rank = {v: i for i, v in enumerate(VERDICT_ORDER)}
    cols: list[Column] = [
        ("framework", "framework", "", lambda r: r["framework"], lambda r: r["framework"], ""),
        ("model", "model", "", lambda r: r["model"], lambda r: r["model"], ""),
        ("quant", "quant", "quantization", lambda r: r["quantization"], lambda r: r["quantization"], ""),
        ("flags", "flags", "the flag-set name; its options are in the row's tooltip",
         lambda r: r["flags"], lambda r: r["flags"], ""),
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
    cols = _columns(multi_len)
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
    more = len(g) - MAX_LISTED
    g = g.head(MAX_LISTED)
    items = "".join(f"<li><b>{n:,}</b> × <span style='color:{STATUS_COLOR.get(st, '#333')}'>{_esc(st)}</span>: "
                    f"{_esc(why)} <span class='muted'>e.g. {_esc(label)}, cell {_esc(cell)}</span></li>"
                    for (st, why), n, label, cell in zip(g.index, g.n, g.label, g.cell))
    return f"<ul>{items}</ul>" + (f"<p class='muted'>and {more:,} other reasons (bench show RUN lists every cell)</p>"
                                  if more > 0 else "")


def table_cells(df: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The cells the per-cell tables show, and what was left out (empty when every cell is shown):
    at most MAX_TABLE_CELLS, the Pareto frontier first, then the fastest cells by speedup."""
    if len(df) <= MAX_TABLE_CELLS:
        return df, ""
    placed = df.speedup.map(_finite) & df.kl_mean.map(_finite)
    front = pd.Series(False, index=df.index)
    if placed.any():
        front[placed] = pareto_front(df.speedup[placed].to_numpy(), df.kl_mean[placed].to_numpy())
    speed = df.speedup.where(df.speedup.map(_finite), -np.inf)
    order = pd.DataFrame({"f": ~front, "s": -speed}).sort_values(["f", "s"], kind="stable").index
    shown = df.loc[sorted(order[:MAX_TABLE_CELLS])]
    note = (f"This run has {len(df):,} cells, more than one page can hold: the table shows {len(shown):,} of them, "
            f"the {int(front.sum())} on the Pareto frontier and then the fastest by speedup; the engine-config table "
            f"aggregates every cell, and every cell's numbers are in `bench compare RUN -o cells.parquet` "
            f"or `bench export RUN`.")
    return shown, note


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
    g = g.head(MAX_TABLE_CELLS)
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
    note = "" if total <= MAX_TABLE_CELLS else \
        f"<p class='muted'>The {MAX_TABLE_CELLS:,} of {total:,} engine configs with the best lossless speedup.</p>"
    return (note + f'<div class="wrap"><table class="sortable" id="configs"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')


def _kv(rows: list[tuple[str, Any]]) -> str:
    return '<table class="kv">' + "".join(f"<tr><td>{_esc(k)}</td><td>{_esc(v)}</td></tr>" for k, v in rows) + "</table>"


def _chips(counts: dict[str, int], colors: dict[str, str]) -> str:
    return "".join(f'<span class="chip" style="background:{colors.get(k, "#555")}">{_esc(k)}: {n}</span>'
                   for k, n in counts.items() if n)


def _status_counts(df: pd.DataFrame) -> dict[str, int]:
    counts = df.status.value_counts().to_dict()
    return {s: int(counts.pop(s, 0)) for s in STATUSES} | {str(k): int(v) for k, v in counts.items()}


def _verdict_counts(df: pd.DataFrame) -> dict[str, int]:
    counts = df.verdict.value_counts().to_dict()
    return {v: int(counts.get(v, 0)) for v in VERDICT_ORDER}


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


def render_html(df: pd.DataFrame, manifest: dict, run_name: str, analysis_error: str | None = None) -> str:
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
    lines, seen = [], set()
    for name, verdicts in (("Fastest lossless (identical or lossless)", ("identical", "lossless")),
                           ("Fastest near-lossless or better", ("identical", "lossless", "near-lossless"))):
        r = _fastest(df, verdicts)
        if r and r["cell_id"] not in seen:
            seen.add(r["cell_id"])
            lines.append(f"<li>{name}: <b>{_esc(r['label'])}</b> — {_esc(_speed(r))}, {_esc(r['verdict'])}</li>")
    if lines:
        parts.append("<ul>" + "".join(lines) + "</ul>")
    if len(bad) > MAX_LISTED:
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
    fig, left_out = quality_figure(df, tolerances)
    if fig is not None:
        parts.append(_fig_html(fig, "plot-quality"))
        parts.append("<p class='muted'>One point per cell (hover for details). Speedup = the cell's output tokens/s "
                     "÷ its baseline cell's (same batch size where one was measured), with its 95% CI "
                     "(Welch t interval on the log ratio of the per-repeat throughputs). "
                     "Diamonds: KL exactly 0 (bitwise-equal logprobs), drawn at the axis floor. The dashed step line "
                     "is the Pareto frontier: cells no other cell beats on both speed and KL.</p>")
    else:
        parts.append("<p class='muted'>No cell has both a speedup and a KL to place.</p>")
    if fig is not None and fig._note:
        parts.append(f"<p class='muted'><b>{_esc(fig._note)}</b></p>")
    if len(left_out) > MAX_LISTED:
        parts.append(f"<p class='muted'>Not placed (no KL or no speedup, see their verdict reason): {len(left_out):,} "
                     f"cells; by verdict: {_esc(_counts(df.verdict[~(df.speedup.map(_finite) & df.kl_mean.map(_finite))]))}</p>")
    elif left_out:
        parts.append(f"<p class='muted'>Not placed (no KL or no speedup, see their verdict reason): "
                     f"{_esc(', '.join(left_out))}</p>")

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
                                              ("workload", json.dumps(matrix.get("workload") or {})),
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


# ------------------------------------------------------------------ markdown

def _md(v: Any) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def render_markdown(df: pd.DataFrame, manifest: dict, run_name: str, analysis_error: str | None = None) -> str:
    matrix = manifest.get("matrix") or {}
    baseline = matrix.get("baseline") or {}
    sc = ", ".join(f"{n} {s}" for s, n in _status_counts(df).items() if n)
    vc = ", ".join(f"{n} {v}" for v, n in _verdict_counts(df).items() if n)
    out = [f"## lossless-bench: {run_name}", "",
           f"Matrix `{matrix.get('name', '?')}`, {len(df)} cells: {sc or 'none'}. Verdicts: {vc or 'none'}. "
           f"Baseline: {', '.join(f'{k}={v}' for k, v in baseline.items()) or '-'}.", ""]
    if analysis_error:
        out += [f"> The analysis could not run: {_md(analysis_error)}", ""]
    multi_len = df[["input_len", "output_len"]].drop_duplicates().shape[0] > 1
    head = ["framework", "model", "quant", "flags", "batch"] + (["in", "out"] if multi_len else []) + [
        "status", "verdict", "KL mean", "noise KL", "greedy", "speedup [95% CI]", "out tok/s", "TTFT p50 ms",
        "TPOT p50 ms", "reason"]
    shown, note = table_cells(df)
    if note:
        out += [f"> {note}", ""]
    out += ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in shown.to_dict("records"):
        row = [r["framework"], r["model"], r["quantization"], r["flags"], r["batch_size"]] + (
            [r["input_len"], r["output_len"]] if multi_len else []) + [
            r["status"], f"**{r['verdict']}**" if r["verdict"] in ("lossy",) else r["verdict"], _sci(r["kl_mean"]),
            _sci(r["noise_kl_mean"]), _num(r["greedy_match"], ".2f"), _speed(r), _num(r["output_tok_s"], ".1f"),
            _ttft(r), _num(r["tpot_ms_p50"], ".2f"), first_line(_why(r), 120)]
        out.append("| " + " | ".join(_md(x) for x in row) + " |")
    apart = [r for r in shown.to_dict("records") if _ttft_disagrees(r)]
    if apart:
        out += ["", f"⚑ {len(apart)} cell(s) whose TTFT and the engine's own figure are more than 1 ms or 10% apart:", ""]
        out += [f"- `{r['cell_id']}` {_md(r['label'])}: ours {_num(r['ttft_ms_p50'], '.2f')} ms, the engine's "
                f"{_num(r.get('engine_ttft_ms_p50'), '.2f')} ms" for r in apart]
    bad = df[df.status != "ok"]
    if len(bad) > MAX_LISTED:
        why = pd.Series([f"{st}: {first_line(r) or '-'}" for st, r in zip(bad.status, bad.status_reason)])
        out += ["", f"**{len(bad):,} cell(s) not ok**, by status and reason:", ""]
        out += [f"- {n:,} × {_md(w)}" for w, n in why.value_counts().head(MAX_LISTED).items()]
    elif len(bad):
        out += ["", f"**{len(bad)} cell(s) not ok:**", ""]
        out += [f"- `{r['cell_id']}` {_md(r['label'])}: {r['status']}: {_md(first_line(r.get('status_reason')) or '-')}"
                for r in bad.to_dict("records")]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------ entry point

def write_report(run_dir: str | Path, output: str | Path | None = None) -> tuple[Path, Path]:
    """Write report.html (default: RUN/report.html) and report.md beside it; returns both paths."""
    root = Path(run_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"no run directory at {root}")
    if not (root / "cells").exists() and not (root / "manifest.json").exists():
        raise FileNotFoundError(f"{root} is not a run directory (no cells/ and no manifest.json)")
    html_path = Path(output) if output else root / "report.html"
    md_path = html_path.with_suffix(".md")
    df, manifest, err = load(root)
    name = str(manifest.get("run_id") or root.name)
    from orchestrator.store import atomic_write_text

    atomic_write_text(html_path, render_html(df, manifest, name, err))
    atomic_write_text(md_path, render_markdown(df, manifest, name, err))
    for p in (html_path, md_path):  # a temporary file is private; a report is for sharing
        p.chmod(0o644)
    return html_path, md_path


# ------------------------------------------------------------------ bench ls / bench export

def _is_run(path: Path) -> bool:
    return (path / "manifest.json").is_file() or (path / "cells").is_dir()


def list_runs(results: str | Path) -> pd.DataFrame:
    """One row per run directory in `results` (or `results` itself when it is a run)."""
    root = Path(results)
    runs = [root] if _is_run(root) else sorted(p for p in root.iterdir() if p.is_dir() and _is_run(p)) \
        if root.is_dir() else []
    rows = []
    for path in runs:
        store = RunStore(path)
        manifest = store.read_manifest()
        t = store.read_cells_table(["status", "framework"])   # per-cell and compacted files, each cell once
        status, frameworks = t["status"].to_pylist(), t["framework"].to_pylist()
        sessions = manifest.get("sessions") or []
        started = min((s["started"] for s in sessions if s.get("started")), default=None)
        ended = sessions[-1].get("ended") if sessions else None
        rows.append({"run": path.name, "path": str(path), "matrix": (manifest.get("matrix") or {}).get("name"),
                     "ok": sum(s == "ok" for s in status), "stored": len(status),
                     "planned": len(manifest.get("cells") or []) or len(status),
                     "frameworks": ",".join(sorted(set(frameworks))), "started": started, "ended": ended})
    return pd.DataFrame(rows, columns=["run", "path", "matrix", "ok", "stored", "planned", "frameworks", "started",
                                       "ended"])


def _plain(v: Any) -> Any:
    """JSON-safe: NaN/inf -> None, lists recursively."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def _write_rows(batches, names: list[str], path: Path, fmt: str) -> int:
    import csv
    import os
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    n = 0
    try:
        with os.fdopen(fd, "w", newline="") as f:
            writer = csv.writer(f) if fmt == "csv" else None
            if writer:
                writer.writerow(names)
            for batch in batches:
                for row in batch.to_pylist():
                    values = [_plain(row.get(k)) for k in names]
                    if writer:
                        writer.writerow(["" if v is None else json.dumps(v) if isinstance(v, list) else v
                                         for v in values])
                    else:
                        f.write(json.dumps(dict(zip(names, values)), allow_nan=False) + "\n")
                    n += 1
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return n


def export_run(run_dir: str | Path, fmt: str = "csv", out_dir: str | Path | None = None,
               logprobs: bool = True) -> dict[Path, int]:
    """cells.<fmt> (and logprobs.<fmt>) in out_dir (default RUN/export); {path: rows written}.

    CSV: one header row, list columns as JSON arrays, missing values empty. JSONL: one JSON object
    per line, missing values and NaN as null.
    """
    if fmt not in ("csv", "jsonl"):
        raise ValueError(f"format must be csv or jsonl, got {fmt!r}")
    store = RunStore(run_dir)
    if not _is_run(store.root):
        raise FileNotFoundError(f"{store.root} is not a run directory (no cells/ and no manifest.json)")
    out = Path(out_dir) if out_dir else store.root / "export"
    # arrow, not pandas: integer columns with a null stay integers; each cell once (its newest copy)
    cells = store.read_cells_table()
    written = {out / f"cells.{fmt}": _write_rows(cells.to_batches(), cells.schema.names, out / f"cells.{fmt}", fmt)}
    if logprobs:
        from orchestrator.store import LOGPROBS_SCHEMA

        path = out / f"logprobs.{fmt}"
        batches = store.logprob_batches(batch_size=65536)
        written[path] = _write_rows(batches, LOGPROBS_SCHEMA.names, path, fmt)
    return written
