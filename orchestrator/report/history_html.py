"""history.html: `bench history` as one offline page: per configuration, output tokens/s, TTFT p50 and
KL against the run's baseline over the runs (one point per run), the provenance change at each step in
the point's hover and in a table below."""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

from orchestrator.matrix.cells import load_label
from orchestrator.report.figures import config_colors
from orchestrator.store.run_store import atomic_write_text
from orchestrator.values import finite

_ROWS = (("output_tok_s", "output tokens/s", "linear"), ("ttft_ms_p50", "TTFT p50 (ms)", "linear"),
         ("kl_mean", "KL vs the run's baseline", "log"))


def _label(r: dict) -> str:
    return f"{r['framework']}/{r['model']}/{r['quantization']}/{r['flags']} " + load_label(
        r.get("mode"), r["batch_size"], r.get("request_rate"))




def history_figure(df: pd.DataFrame):
    """The panels (tokens/s, TTFT, KL) over the runs: one line per configuration, in one colour in every
    panel and in the shared legend (figures.config_colors)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    runs = list(dict.fromkeys(df.run))
    fig = make_subplots(rows=len(_ROWS), cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=[t for _, t, _ in _ROWS])
    records = df.to_dict("records")
    colors = config_colors(_label(r) for r in records)
    for label in dict.fromkeys(_label(r) for r in records):
        pts = [r for r in records if _label(r) == label]
        hover = [f"{label}<br>run {r['run']} ({r['started']})<br>{r['status']}, {r['verdict']}<br>"
                 f"changed: {html.escape(str(r['changed']))[:300]}" for r in pts]
        for i, (col, _, _) in enumerate(_ROWS, 1):
            ys = [r[col] if finite(r[col]) and (col != "kl_mean" or r[col] > 0) else None for r in pts]
            fig.add_trace(go.Scatter(x=[r["run"] for r in pts], y=ys, mode="lines+markers", name=label,
                                     legendgroup=label, showlegend=i == 1, hovertext=hover, hoverinfo="text+y",
                                     line=dict(color=colors[label]), marker=dict(color=colors[label])),
                          row=i, col=1)
    for i, (_, _, scale) in enumerate(_ROWS, 1):
        fig.update_yaxes(type=scale, row=i, col=1)
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=runs)
    fig.update_layout(height=320 * len(_ROWS), template="plotly_white", hovermode="closest",
                      legend=dict(orientation="h", y=-0.08), margin=dict(l=70, r=20, t=40, b=40))
    return fig


def render_history_html(df: pd.DataFrame, title: str) -> str:
    import plotly.offline

    runs = list(dict.fromkeys(df.run))
    fig = history_figure(df)
    steps = df[~df.changed.isin(["first run", ""]) & df.changed.notna()]
    table = "".join(f"<tr><td>{html.escape(str(r['run']))}</td><td>{html.escape(_label(r))}</td>"
                    f"<td>{html.escape(str(r['changed']))}</td></tr>" for r in steps.to_dict("records"))
    return ("<!doctype html><html><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><script>{plotly.offline.get_plotlyjs()}</script>"
            "<style>body{font-family:system-ui,sans-serif;margin:1.5em}td{padding:2px 8px;vertical-align:top}"
            "table{border-collapse:collapse}tr:nth-child(even){background:#f4f4f4}</style></head><body>"
            f"<h1>{html.escape(title)}</h1><p>{len(runs)} runs, {df.cell_id.nunique()} configurations; one point per "
            "run. Quality is each run's verdict against its own baseline.</p>"
            + fig.to_html(full_html=False, include_plotlyjs=False, div_id="history",
                          config={"displaylogo": False, "responsive": True})
            + "<h2>What changed between runs</h2>"
            + (f"<table><tr><th>run</th><th>configuration</th><th>changed since the run before</th></tr>{table}</table>"
               if table else "<p>Nothing recorded changed.</p>")
            + "</body></html>\n")


def write_history_html(df: pd.DataFrame, path: str | Path, title: str) -> Path:
    path = Path(path)
    atomic_write_text(path, render_history_html(df, title))
    return path
