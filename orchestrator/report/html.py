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
               pair of cells (orchestrator/judge/cross_run.py): verdict against OLD, NEW/OLD ratios of
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

The figures are in orchestrator/report/figures.py, the tables in orchestrator/report/html_tables.py.
A script error in the page shows as a red banner and in the `data-report-errors` attribute of
<html>; `data-plots` on <body> counts the plots that drew (the test reads both from a headless
Chromium). The caps on what one page holds are read as report_data.MAX_* when the page is built.
"""

from __future__ import annotations

import datetime as _dt
import json
from typing import Any

import pandas as pd

from orchestrator.report import data as report_data
from orchestrator.report.panels import sampling as report_sampling
from orchestrator.report.panels import mixes as report_mixes
from orchestrator.report.panels import searches as report_searches
from orchestrator.report.panels import telemetry as report_telemetry
from orchestrator.report.compact import speed_text
from orchestrator.report.data import (
    count_statuses,
    count_task_verdicts,
    count_verdicts,
    first_line,
    no_tasks_text,
    table_cells,
)
from orchestrator.report.figures import STATUS_COLOR, TASK_VERDICT_COLOR, VERDICT_COLOR, quality_figure, speed_figure
from orchestrator.report.html_tables import (
    against_section,
    bad_groups,
    cells_table,
    chips,
    configs_table,
    counts_text,
    esc,
    fig_html,
    kv_table,
    ppl_table,
    sortable,
    task_tables,
    versions_rows,
)
from orchestrator.store.manifest import Manifest
from orchestrator.values import finite

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


def _task_panel(tasks: Any, df: pd.DataFrame, manifest: Manifest, against: Any = None) -> str:
    """The task layer: per task its cells against the baseline, item by item (orchestrator/judge/task_verdicts.py);
    with --against, per task each cell against its partner in OLD; and perplexity, the logit layer's
    task figure, per cell."""
    alpha = manifest.tolerances.task_alpha
    parts = ['<h2 id="tasks">Task layer</h2>']
    if tasks is not None and tasks.error:
        parts.append(f'<div class="banner">The task analysis could not run: {esc(tasks.error)}</div>')
    elif tasks is None or not len(tasks.table):
        parts.append(f"<p class='muted' id='no-tasks'>{esc(no_tasks_text(manifest))}</p>")
    else:
        parts.append(f"<div>cells {chips(count_task_verdicts(df), TASK_VERDICT_COLOR)}</div>")
        parts.append("<p class='muted'>Each cell's task sets, scored item by item and paired with its baseline "
                     "cell's same items. Score: the metric's mean with its 95% CI (Wilson for 0/1 metrics, else a "
                     "bootstrap). Change (cell − baseline) and ratio (cell ÷ baseline, MLPerf's accuracy ratio): "
                     "paired bootstrap 95% CIs. Test: McNemar's exact test on the items that flipped (0/1 metrics), "
                     f"else a paired bootstrap test; regressed or improved where p &lt; {esc(alpha)} (task_alpha), "
                     "else no change. The quality plot above can show each task's score on its quality axis.</p>")
        parts += task_tables(tasks, "task")
    vs = against.tasks if against is not None else None
    if vs is not None and (vs.error or len(vs.table)):
        parts.append(f'<h3 id="tasks-against">Tasks against {esc(against.name)}</h3>')
        if vs.error:
            parts.append(f"<p class='muted'>No task comparison with {esc(against.name)}: {esc(vs.error)}</p>")
        else:
            parts.append(f"<p class='muted'>Each cell of this run against its partner in {esc(against.name)}, "
                         "item by item, with the same tests: the baseline column is the partner's score.</p>")
            parts += task_tables(vs, "vs-task")
    parts.append('<h3 id="perplexity">Perplexity (logit layer)</h3>'
                 "<p class='muted'>Per cell on the scoring text (teacher forced, the positions the cell and its "
                 "baseline both scored): the cell's perplexity, the baseline's, and ppl_rel = ppl ÷ baseline's − 1 "
                 "next to the baseline engine's own |ppl_rel| noise; the logit verdict weighs it with the other "
                 "logit metrics.</p>" + ppl_table(df))
    return "\n".join(parts)


def _sampling_panel(layer: Any, df: pd.DataFrame, manifest: Manifest) -> str:
    """The sampling layer: per cell with samples, seed by seed and both distribution tests
    (orchestrator/report/panels/sampling.py defines the columns, shared with report.md)."""
    parts = ['<h2 id="sampling">Sampling layer</h2>']
    recs = report_sampling.rows(layer, df)
    if layer.error:
        parts.append(f'<div class="banner">The sampling analysis could not run: {esc(layer.error)}</div>')
    elif not recs:
        parts.append(f"<p class='muted' id='no-sampling'>{esc(report_sampling.no_sampling_text(manifest))}</p>")
    else:
        counts = pd.Series([r.get("sampling_verdict") or "n/a" for r in recs]).value_counts().to_dict()
        parts.append(f"<div>cells {chips(counts, report_sampling.SAMPLING_VERDICT_COLOR)}</div>")
        parts.append(f"<p class='muted'>{esc(report_sampling.explanation(layer))}</p>")
        parts.append(sortable("sampling-table", report_sampling.columns(), recs,
                               lambda r: report_sampling.SAMPLING_VERDICT_COLOR.get(r.get("sampling_verdict"), "#333"),
                               report_sampling.why))
    return "\n".join(parts)


def _telemetry_panel(df: pd.DataFrame) -> str:
    """Engine telemetry and energy per ok cell, the prefix-cache hit rate beside TTFT, and why a figure is
    empty (orchestrator/report/panels/telemetry.py defines the columns, shared with report.md)."""
    parts = ['<h2 id="telemetry">Engine telemetry and energy</h2>']
    recs, note = report_telemetry.rows(df)
    if not recs:
        return parts[0] + "<p class='muted' id='no-telemetry'>No cell ran ok: nothing was measured.</p>"
    if note:
        parts.append(f"<p class='muted'><b>{esc(note)}</b></p>")
    parts.append(f"<p class='muted'>{esc(report_telemetry.EXPLANATION)}</p>")
    if report_telemetry.measured(recs):
        cols = report_telemetry.columns(report_telemetry.has_workloads(df))
        parts.append(sortable("telemetry-table", cols, recs, lambda r: "#333",
                               lambda r: f"cell {r['cell_id']}"))
    else:
        parts.append("<p class='muted' id='no-telemetry'>No cell measured any of these figures.</p>")
    why = report_telemetry.not_measured(recs)
    if why:
        shown = why[:report_data.MAX_LISTED]
        more = f"<li>… and {len(why) - len(shown)} more reasons</li>" if len(why) > len(shown) else ""
        parts.append("<details id='telemetry-missing'><summary>Not measured, and why</summary><ul>"
                     + "".join(f"<li>{esc(w)}</li>" for w in shown) + more + "</ul></details>")
    return "\n".join(parts)


def _search_panel(layer: Any) -> str:
    """SLO searches: per configuration the highest load meeting every SLO, then every probe
    (orchestrator/report/panels/searches.py defines the columns, shared with report.md)."""
    parts = ['<h2 id="searches">SLO search</h2>']
    if layer.error:
        return parts[0] + f'<div class="banner">The searches could not be read: {esc(layer.error)}</div>'
    parts.append(f"<p class='muted'>{esc(report_searches.EXPLANATION)}</p>")
    parts.append(sortable("search-table", report_searches.summary_columns(layer.probes),
                           layer.summaries.to_dict("records"),
                           lambda r: "#333", lambda r: f"search {r['cell_id']}"))
    if len(layer.probes):
        parts.append("<h3>Probes</h3>")
        parts.append(sortable("probe-table", report_searches.probe_columns(), layer.probes.to_dict("records"),
                               lambda r: "#1a7f37" if r.get("search_meets") else "#d73027",
                               lambda r: f"probe {r['cell_id']} of search {r['search_id']}"))
    return "\n".join(parts)


def _culprit_panel(layer: Any) -> str:
    """`bench explain`'s culprit searches, one block per explained cell (panels/searches.py's columns)."""
    parts = [f'<h2 id="culprits">{esc(report_searches.CULPRIT_TITLE)}</h2>',
             f"<p class='muted'>{esc(report_searches.CULPRIT_EXPLANATION)}</p>"]
    parts += [f'<div class="banner">Not read: {esc(p)}</div>' for p in layer.problems]
    for r in layer.results:
        parts.append(f"<h3>{esc(report_searches.culprit_heading(r))}</h3><p>{esc(report_searches.culprit_summary(r))}</p>")
        parts.append(sortable(f"culprit-{r.cell_id}", report_searches.culprit_columns(), [p.model_dump() for p in r.probes],
                              lambda p: "#1a7f37" if p.get("restores") else "#d73027",
                              lambda p: f"probe {p.get('cell_id')}"))
    if layer.layers:
        parts.append(f"<p class='muted'>{esc(report_searches.LAYERS_EXPLANATION)}</p>")
    for rep in layer.layers:
        parts.append(f"<h3>{esc(report_searches.layers_heading(rep))}</h3><p>{esc(report_searches.layers_summary(rep))}</p>")
        if rep["rows"]:
            parts.append(sortable(f"layers-{rep['cell_id']}", report_searches.layer_columns(), rep["rows"],
                                  lambda r: "#d73027" if r.get("beyond_floor") else "#1a7f37",
                                  lambda r: f"{rep['cell_id']} {r['name']}"))
    parts.append(_mix_panel(layer.mixes))
    return "\n".join(parts)


def _mix_panel(mixes: list) -> str:
    """`--sensitivity` and `--recipe` per explained cell (panels/mixes.py), saying so where a cell has neither."""
    if not mixes:
        return ""
    parts = [f'<h3 id="mixes">{esc(report_mixes.TITLE)}</h3>', f"<p class='muted'>{esc(report_mixes.EXPLANATION)}</p>"]
    for e in mixes:
        if e.sensitivity:
            s = e.sensitivity
            parts.append(f"<h4>{esc(report_mixes.sensitivity_heading(s))}</h4>")
            parts.append(sortable(f"sens-{e.cell_id}", report_mixes.sensitivity_columns(), s.get("groups") or [],
                                  lambda r: "#1a7f37" if r.get("status") == "ok" else "#d73027",
                                  lambda r: f"probe {r.get('cell_id')}"))
        if e.recipe:
            r = e.recipe
            parts.append(f"<h4>{esc(report_mixes.recipe_heading(r))}</h4><p>{esc(report_mixes.recipe_summary(r))}</p>")
            parts.append(sortable(f"recipe-{e.cell_id}", report_mixes.recipe_columns(), report_mixes.recipe_rows(r),
                                  lambda c: "#1a7f37" if c.get("within_budget") else "#d73027",
                                  lambda c: f"cell {c.get('cell_id')}"))
    lacking = [line for line in map(report_mixes.none_line, mixes) if line]
    parts += [f"<p class='muted'>{esc(line)}</p>" for line in lacking]
    return "\n".join(parts)


def _fastest(df: pd.DataFrame, verdicts: tuple[str, ...]) -> dict | None:
    d = df[df.verdict.isin(verdicts) & df.speedup.map(finite)]
    return None if d.empty else d.loc[d.speedup.idxmax()].to_dict()


def _duration(s: dict) -> str:
    try:
        a, b = (_dt.datetime.fromisoformat(s[k]) for k in ("started", "ended"))
        return f"{(b - a).total_seconds() / 60:.1f} min"
    except (KeyError, TypeError, ValueError):
        return "not ended (running, or killed)"


def render_html(df: pd.DataFrame, manifest: Manifest, run_name: str, analysis_error: str | None = None,
                against: Any = None, tasks: Any = None, sampling: Any = None, searches: Any = None,
                culprits: Any = None, missing: list[tuple[str, str]] | None = None) -> str:
    """The page; against (a report_data.Against) adds the moves from OLD to the quality plot and the
    section with this run against OLD; tasks (a report_data.TaskLayer) the task quality axes and panel;
    searches (a report_searches.SearchLayer) the SLO-search panel."""
    import plotly
    import plotly.offline

    stored = manifest.to_json()["matrix"]   # the matrix as the run dir holds it, shown as it is
    tolerances, baseline, host = manifest.tolerances, manifest.baseline, manifest.host
    status_counts, verdict_counts = count_statuses(df), count_verdicts(df)
    bad = df[df.status != "ok"]

    parts = [f"<h1>{esc(run_name)}</h1>",
             f'<div class="muted">matrix <b>{esc(manifest.name or "?")}</b> · {len(df)} cells · '
             f'baseline {esc(", ".join(f"{k}={v}" for k, v in baseline.items()) or "-")} · generated '
             f'{_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}</div>',
             '<div id="script-errors" class="banner" style="display:none"></div>']
    if analysis_error:
        parts.append(f'<div class="banner">The analysis could not run, so verdicts, KL and speedups are empty: '
                     f'{esc(analysis_error)}</div>')
    if missing:   # planned cells the run dir holds no row of (orchestrator/store/verify.py: missing_cells)
        parts.append(f'<div class="banner">{len(missing)} planned cell(s) missing: '
                     + "; ".join(esc(f"{c}: {why}") for c, why in missing[:20])
                     + (f"; and {len(missing) - 20} more" if len(missing) > 20 else "") + "</div>")

    # summary
    parts.append("<h2>Summary</h2>")
    parts.append(f"<div>status {chips(status_counts, STATUS_COLOR)}</div>")
    parts.append(f"<div>verdict {chips(verdict_counts, VERDICT_COLOR)}</div>")
    if tasks is not None and len(tasks.table):
        parts.append(f"<div>tasks {chips(count_task_verdicts(df), TASK_VERDICT_COLOR)}</div>")
    lines, seen = [], set()
    for name, verdicts in (("Fastest lossless (identical or lossless)", ("identical", "lossless")),
                           ("Fastest near-lossless or better", ("identical", "lossless", "near-lossless"))):
        r = _fastest(df, verdicts)
        if r and r["cell_id"] not in seen:
            seen.add(r["cell_id"])
            lines.append(f"<li>{name}: <b>{esc(r['label'])}</b> — {esc(speed_text(r, call=False))}, {esc(r['verdict'])}</li>")
    if lines:
        parts.append("<ul>" + "".join(lines) + "</ul>")
    from orchestrator.judge.reconcile import disagreements

    disagree = disagreements(df, tasks, sampling, tolerances.task_alpha)
    if disagree:
        parts.append("<h3 id='layers-disagree'>Where the layers disagree</h3><ul>"
                     + "".join(f"<li><b>{esc(name)}</b>: {esc(line)}</li>" for name, line in disagree) + "</ul>")
    if len(bad) > report_data.MAX_LISTED:
        parts.append(f"<p class='bad'><b>{len(bad):,} of {len(df):,} cells did not run ok</b>, grouped by status and "
                     f"the first line of the reason:</p>" + bad_groups(bad))
    elif len(bad):
        items = "".join(f"<li><b>{esc(r['label'])}</b> <span style='color:{STATUS_COLOR.get(r['status'], '#333')}'>"
                        f"{esc(r['status'])}</span>: {esc(first_line(r.get('reason')) or '(no reason given)')}"
                        f" <span class='muted'>cell {esc(r['cell_id'])}</span></li>"
                        for r in bad.to_dict("records"))
        parts.append(f"<p class='bad'><b>{len(bad)} of {len(df)} cells did not run ok:</b></p><ul>{items}</ul>")
    else:
        parts.append(f"<p>All {len(df)} cells ran ok.</p>" if len(df) else "<p>No cells are stored in this run.</p>")

    # quality vs speed
    parts.append("<h2>Quality vs speed</h2>")
    fig, left_out = quality_figure(df, tolerances, against, tasks)
    if fig is not None:
        parts.append(fig_html(fig, "plot-quality"))
        parts.append("<p class='muted'>One point per cell (hover for details). Speedup = the cell's output tokens/s "
                     "÷ its baseline cell's (same batch size where one was measured), with its 95% CI "
                     "(Welch t interval on the log ratio of the per-repeat throughputs). "
                     "Diamonds: KL exactly 0 (bitwise-equal logprobs), drawn at the axis floor. The dashed step line "
                     "is the Pareto frontier: cells no other cell beats on both speed and KL.</p>")
        if len(fig._views) > 1:
            parts.append(f"<p class='muted' id='quality-axes'>Quality axis (the menu above the plot): "
                         f"{esc(', '.join(fig._views))}. On a task's axis a point is the cell's score with its 95% CI, "
                         "coloured by its task verdict against the baseline; higher is better, so there the frontier "
                         "holds the cells no other cell beats on both speed and score.</p>")
    else:
        parts.append("<p class='muted'>No cell has both a speedup and a KL to place.</p>")
    if fig is not None and fig._note:
        parts.append(f"<p class='muted'><b>{esc(fig._note)}</b></p>")
    if len(left_out) > report_data.MAX_LISTED:
        parts.append(f"<p class='muted'>Not placed (no KL or no speedup, see their verdict reason): {len(left_out):,} "
                     f"cells; by verdict: {esc(counts_text(df.verdict[~(df.speedup.map(finite) & df.kl_mean.map(finite))]))}</p>")
    elif left_out:
        parts.append(f"<p class='muted'>Not placed (no KL or no speedup, see their verdict reason): "
                     f"{esc(', '.join(left_out))}</p>")
    if against is not None:
        parts.append(against_section(against, fig))
    parts.append(_task_panel(tasks, df, manifest, against))
    if sampling is not None:
        parts.append(_sampling_panel(sampling, df, manifest))
    parts.append(_telemetry_panel(df))
    if searches is not None:
        parts.append(_search_panel(searches))
    if culprits is not None:
        parts.append(_culprit_panel(culprits))

    # throughput and latency
    parts.append("<h2>Throughput and latency vs batch size</h2>")
    sfig = speed_figure(df)
    if sfig is not None:
        parts.append(fig_html(sfig, "plot-speed"))
        parts.append("<p class='muted'>One line per engine config (framework/model/quantization/flags); "
                     "latency markers are p50, the error bar reaches p99. Click a legend entry to hide a config."
                     + (f" <b>{esc(sfig._note)}</b>" if sfig._note else "") + "</p>")
    else:
        parts.append("<p class='muted'>No ok cell to plot.</p>")

    # cells
    parts.append("<h2>Cells</h2><p class='muted'>Click a header to sort. Grey columns: the noise floor "
                 "(the baseline engine against itself, run to run and batch 1 vs N) next to the metric it floors; "
                 "a deviation within it counts as lossless. Hover a row for its cell id and flags.</p>")
    shown, note = table_cells(df)
    if note:
        parts.append(f"<p class='muted'><b>{esc(note)}</b></p>")
        parts.append("<h3>Engine configs</h3>" + configs_table(df))
    parts.append(cells_table(shown))

    # provenance
    gpus = host.get("gpus") or []
    gpu_text = "; ".join(f"{g.get('name')} ({(g.get('memory_bytes') or 0) / 2**30:.0f} GiB, driver "
                         f"{g.get('driver') or host.get('nvidia_driver')})"
                         for g in gpus) or "none (CPU run)"
    mem = host.get("memory_bytes")
    host_rows = [("CPU", f"{host.get('cpu', '?')} × {host.get('cpu_count', '?')}"), ("GPUs", gpu_text),
                 ("memory", f"{mem / 2**30:.1f} GiB" if finite(mem) else "?"), ("OS", host.get("os", "?")),
                 ("machine", host.get("machine", "?")), ("Python", host.get("python", "?"))]
    sessions = [s.model_dump() for s in manifest.sessions]
    sess = "".join(f"<tr><td>{esc(s.get('started'))}</td><td>{esc(s.get('ended') or '-')}</td>"
                   f"<td>{esc(_duration(s))}</td></tr>" for s in sessions)
    drivers = sorted(manifest.driver_versions.items())
    parts.append("<h2>Provenance</h2><div class='grid'>")
    parts.append("<div><h3>Run</h3>" + kv_table([("run", run_name), ("run_id", manifest.run_id or "?"),
                                              ("matrix", manifest.name or "?"),
                                              ("schema version", manifest.schema_version or "?"),
                                              ("cells planned / stored", f"{len(manifest.cells)} / {len(df)}"),
                                              ("workload", json.dumps(stored.get("workloads")
                                                                      or stored.get("workload") or {})),
                                              ("baseline", json.dumps(baseline)),
                                              ("tolerances", json.dumps(tolerances.model_dump(), sort_keys=True))])
                 + f"<h3>Sessions</h3><table><thead><tr><th>started</th><th>ended</th><th>took</th></tr></thead>{sess}</table></div>")
    parts.append("<div><h3>Host</h3>" + kv_table(host_rows) + "<h3>Driver (orchestrator) versions</h3>" + kv_table(drivers) + "</div>")
    parts.append("</div><h3>Engine versions per cell</h3>" + versions_rows(df))
    if manifest.matrix_text:
        parts.append(f"<details><summary>The matrix as given</summary><pre>{esc(manifest.matrix_text)}</pre></details>")
    parts.append(f"<p class='muted'>lossless-bench report · plotly {plotly.__version__} inlined; works offline.</p>")

    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{esc(run_name)} — lossless-bench</title>"
            f"<style>{_CSS}</style><script>{_ERRORS_JS}</script>"
            f"<script type='text/javascript'>{plotly.offline.get_plotlyjs()}</script></head><body>"
            + "\n".join(parts) + f"<script>{_SORT_JS}</script></body></html>")
