"""report.md: status and verdict counts, the verdict/speedup table and the cells that are not ok,
for a pull request or an issue; the task layer (one compact table, every task's cells against the
baseline); the sampling layer (a row per cell with samples); engine telemetry and energy (a row per ok cell,
the prefix-cache hit rate beside TTFT, and why a figure is empty); the SLO searches (per configuration, then
every probe); why a cell is lossy (`bench explain`'s culprit searches); with --against OLD, the table of this run against OLD as well, and its tasks against OLD."""

from __future__ import annotations

from typing import Any

import pandas as pd

from orchestrator.report import data as report_data
from orchestrator.report.panels import sampling as report_sampling
from orchestrator.report.panels import mixes as report_mixes
from orchestrator.report.panels import searches as report_searches
from orchestrator.report.panels import telemetry as report_telemetry
from orchestrator.report.compact import speed_text
from orchestrator.report.data import (
    TEST_NAMES,
    against_counts,
    against_rows,
    call_text,
    ci_text,
    count_statuses,
    count_task_verdicts,
    count_verdicts,
    first_line,
    is_judged,
    moved_items_text,
    moved_text,
    no_tasks_text,
    num,
    p_text,
    ratio_text,
    sci,
    table_cells,
    task_counts,
    task_rows,
    ttft_disagrees,
    ttft_text,
    why_text,
)
from orchestrator.store.manifest import Manifest
from orchestrator.values import as_text, md_page_inert


def _md(v: Any) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def render_markdown(df: pd.DataFrame, manifest: Manifest, run_name: str, analysis_error: str | None = None,
                    against: Any = None, tasks: Any = None, sampling: Any = None, searches: Any = None,
                    culprits: Any = None, missing: list[tuple[str, str]] | None = None) -> str:
    baseline = manifest.baseline
    sc = ", ".join(f"{n} {s}" for s, n in count_statuses(df).items() if n)
    vc = ", ".join(f"{n} {v}" for v, n in count_verdicts(df).items() if n)
    with_tasks = tasks is not None and len(tasks.table) > 0
    tc = ", ".join(f"{n} {v}" for v, n in count_task_verdicts(df).items() if n) if with_tasks else ""
    out = [f"## lossless-bench: {run_name}", "",
           f"Matrix `{manifest.name or '?'}`, {len(df)} cells: {sc or 'none'}. Verdicts: {vc or 'none'}. "
           + (f"Tasks: {tc}. " if tc else "")
           + f"Baseline: {', '.join(f'{k}={v}' for k, v in baseline.items()) or '-'}.", ""]
    if analysis_error:
        out += [f"> The analysis could not run: {_md(analysis_error)}", ""]
    if missing:   # planned cells the run dir holds no row of (orchestrator/store/verify.py: missing_cells)
        out += [f"> {len(missing)} planned cell(s) missing: " + "; ".join(_md(f"{c}: {why}") for c, why in missing[:20])
                + (f"; and {len(missing) - 20} more" if len(missing) > 20 else ""), ""]
    multi_len = df[["input_len", "output_len"]].drop_duplicates().shape[0] > 1
    named = report_telemetry.has_workloads(df)
    head = ["framework", "model", "quant", "flags"] + (["workload"] if named else []) + ["batch"] + (
        ["in", "out"] if multi_len else []) + [
        "status", "verdict"] + (["tasks"] if with_tasks else []) + [
        "KL mean", "noise KL", "greedy", "speedup [95% CI]", "out tok/s", "TTFT p50 ms", "TPOT p50 ms", "reason"]
    shown, note = table_cells(df)
    if note:
        out += [f"> {note}", ""]
    out += ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in shown.to_dict("records"):
        row = [r["framework"], r["model"], r["quantization"], r["flags"]] + (
            [as_text(r.get("workload"))] if named else []) + [r["batch_size"]] + (
            [r["input_len"], r["output_len"]] if multi_len else []) + [
            r["status"], f"**{r['verdict']}**" if r["verdict"] in ("lossy",) else r["verdict"]] + (
            [_task_word(r.get("task_verdict"))] if with_tasks else []) + [sci(r["kl_mean"]),
            sci(r["noise_kl_mean"]), num(r["greedy_match"], ".2f"), speed_text(r, call=False), num(r["output_tok_s"], ".1f"),
            ttft_text(r), num(r["tpot_ms_p50"], ".2f"), first_line(why_text(r), 120)]
        out.append("| " + " | ".join(_md(x) for x in row) + " |")
    from orchestrator.judge.reconcile import disagreements

    disagree = disagreements(df, tasks, sampling, manifest.tolerances.task_alpha)
    if disagree:
        out += ["", "Where the layers disagree:", ""] + [f"- {_md(name)}: {_md(line)}" for name, line in disagree]
    apart = [r for r in shown.to_dict("records") if ttft_disagrees(r)]
    if apart:
        out += ["", f"⚑ {len(apart)} cell(s) whose TTFT and the engine's own figure are more than 1 ms or 10% apart:", ""]
        out += [f"- `{r['cell_id']}` {_md(r['label'])}: ours {num(r['ttft_ms_p50'], '.2f')} ms, the engine's "
                f"{num(r.get('engine_ttft_ms_p50'), '.2f')} ms" for r in apart]
    bad = df[df.status != "ok"]
    if len(bad) > report_data.MAX_LISTED:
        why = pd.Series([f"{st}: {first_line(r) or '-'}" for st, r in zip(bad.status, bad.reason)])
        out += ["", f"**{len(bad):,} cell(s) not ok**, by status and reason:", ""]
        out += [f"- {n:,} × {_md(w)}" for w, n in why.value_counts().head(report_data.MAX_LISTED).items()]
    elif len(bad):
        out += ["", f"**{len(bad)} cell(s) not ok:**", ""]
        out += [f"- `{r['cell_id']}` {_md(r['label'])}: {r['status']}: {_md(first_line(r.get('reason')) or '-')}"
                for r in bad.to_dict("records")]
    out += ["", "### Tasks", ""]
    if tasks is not None and tasks.error:
        out += [f"> The task analysis could not run: {_md(tasks.error)}"]
    elif not with_tasks:
        out += [no_tasks_text(manifest)]
    else:
        out += _tasks(tasks, "the baseline")
    if sampling is not None:
        out += ["", "### Sampling", "", *_sampling(sampling, df, manifest)]
    out += ["", "### Engine telemetry and energy", "", *_telemetry(df)]
    if searches is not None:
        out += ["", "### SLO search", "", *_searches(searches)]
    if culprits is not None:
        out += ["", f"### {report_searches.CULPRIT_TITLE}", "", *_culprits(culprits)]
    if against is not None:
        out += ["", *_against(against)]
        vs = against.tasks
        if vs is not None and (vs.error or len(vs.table)):
            out += ["", f"### Tasks against {_md(against.name)}", ""]
            out += [f"> No task comparison: {_md(vs.error)}"] if vs.error else _tasks(vs, f"the partner in {against.name}")
    return md_page_inert("\n".join(out) + "\n")   # what a user named renders as text, never as HTML


def _sampling(layer: Any, df: pd.DataFrame, manifest: Manifest) -> list[str]:
    """The sampling layer: a row per cell with samples (orchestrator/report/panels/sampling.py's columns)."""
    if layer.error:
        return [f"> The sampling analysis could not run: {_md(layer.error)}"]
    recs = report_sampling.rows(layer, df)
    if not recs:
        return [report_sampling.no_sampling_text(manifest)]
    cols = report_sampling.columns()
    out = [report_sampling.explanation(layer), "", "| " + " | ".join(h for _, h, *_ in cols) + " |",
           "|" + "|".join("---" for _ in cols) + "|"]
    for r in recs:
        cells = [text(r) for _, _, _, text, _ in cols]
        cells[-2] = f"**{cells[-2]}**" if cells[-2] == "different" else cells[-2]
        out.append("| " + " | ".join(_md(x) for x in cells) + " |")
    return out


def _table(cols: list, records: list[dict]) -> list[str]:
    """A markdown table of (key, header, sort value, text, css class) columns."""
    out = ["| " + " | ".join(h for _, h, *_ in cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    return out + ["| " + " | ".join(_md(text(r)) for _, _, _, text, _ in cols) + " |" for r in records]


def _telemetry(df: pd.DataFrame) -> list[str]:
    """A row per ok cell (orchestrator/report/panels/telemetry.py's columns), then why a figure is empty."""
    recs, note = report_telemetry.rows(df)
    if not recs:
        return ["No cell ran ok: nothing was measured."]
    out = [f"> {note}", ""] if note else []
    out += [report_telemetry.EXPLANATION, ""]
    if report_telemetry.measured(recs):
        out += _table(report_telemetry.columns(report_telemetry.has_workloads(df)), recs)
    else:
        out += ["No cell measured any of these figures."]
    why = report_telemetry.not_measured(recs)
    if why:
        out += ["", "Not measured, and why:", ""] + [f"- {_md(w)}" for w in why[:report_data.MAX_LISTED]]
        out += [f"- … and {len(why) - report_data.MAX_LISTED} more reasons"] if len(why) > report_data.MAX_LISTED else []
    return out


def _searches(layer: Any) -> list[str]:
    """Per searched configuration, then every probe (orchestrator/report/panels/searches.py's columns)."""
    if layer.error:
        return [f"> The searches could not be read: {_md(layer.error)}"]
    out = [report_searches.EXPLANATION, ""]
    out += _table(report_searches.summary_columns(layer.probes), layer.summaries.to_dict("records"))
    if len(layer.probes):
        out += ["", "Probes:", ""] + _table(report_searches.probe_columns(), layer.probes.to_dict("records"))
    return out


def _culprits(layer: Any) -> list[str]:
    """`bench explain`'s culprit searches: per explained cell its outcome, then its probes."""
    out = [report_searches.CULPRIT_EXPLANATION]
    out += [f"> Not read: {_md(p)}" for p in layer.problems]
    for r in layer.results:
        out += ["", f"**{_md(report_searches.culprit_heading(r))}** (`{r.cell_id}`): "
                f"{_md(report_searches.culprit_summary(r))}", ""]
        out += _table(report_searches.culprit_columns(), [p.model_dump() for p in r.probes])
    if layer.layers:
        out += ["", report_searches.LAYERS_EXPLANATION]
    for rep in layer.layers:
        out += ["", f"**{_md(report_searches.layers_heading(rep))}**: {_md(report_searches.layers_summary(rep))}", ""]
        out += _table(report_searches.layer_columns(), rep["rows"]) if rep["rows"] else []
    return out + _mixes(layer.mixes)


def _mixes(mixes: list) -> list[str]:
    """`--sensitivity` and `--recipe` per explained cell (panels/mixes.py), saying so where a cell has neither."""
    if not mixes:
        return []
    out = ["", f"#### {report_mixes.TITLE}", "", report_mixes.EXPLANATION]
    for e in mixes:
        if e.sensitivity:
            out += ["", f"**{_md(report_mixes.sensitivity_heading(e.sensitivity))}**", ""]
            out += _table(report_mixes.sensitivity_columns(), e.sensitivity.get("groups") or [])
        if e.recipe:
            out += ["", f"**{_md(report_mixes.recipe_heading(e.recipe))}**: {_md(report_mixes.recipe_summary(e.recipe))}", ""]
            out += _table(report_mixes.recipe_columns(), report_mixes.recipe_rows(e.recipe))
    lacking = [line for line in map(report_mixes.none_line, mixes) if line]
    return out + (["", *[f"- {_md(line)}" for line in lacking]] if lacking else [])


def _task_word(v: Any) -> str:
    return f"**{v}**" if v == "regressed" else as_text(v)


def _tasks(layer: Any, base: str) -> list[str]:
    """The task layer in one table: a row per (task, cell), regressions first within each task, after a
    line per task with n and the cells per verdict."""
    tv = layer.table
    out = [f"- **{_md(task)}**: {_md(task_counts(tv, task))}" for task in layer.tasks]
    out += ["", f"Score with its 95% CI; change and ratio against {_md(base)} over the same items, paired "
            "bootstrap 95% CIs; p from McNemar's exact test (0/1 metrics) or a paired bootstrap test.", ""]
    head = ["task", "engine config", "load", "n", "score [95% CI]", "baseline", "change [95% CI]", "ratio [95% CI]",
            "test", "p", "items worse / better", "verdict"]
    out += ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    notes = []
    for task in layer.tasks:
        rows, note = task_rows(tv, task)
        for r in rows.to_dict("records"):
            judged = is_judged(r)
            verdict = _task_word(r.get("task_verdict")) + ("" if judged else f" ({first_line(r.get('task_reason'), 100)})")
            row = [task, as_text(r.get("config")), as_text(r.get("load_label")), num(r.get("n"), ".0f"),
                   ci_text(r, "score", ".3f"), num(r.get("base_score"), ".3f") if judged else "",
                   ci_text(r, "change", "+.3f") if judged else "", ci_text(r, "ratio", ".3f") if judged else "",
                   TEST_NAMES.get(r.get("test"), ""), p_text(r), moved_items_text(r), verdict]
            out.append("| " + " | ".join(_md(x) for x in row) + " |")
        if note:
            notes.append(f"> {note}")
    return out + ([""] + notes if notes else [])


def _against(ag: Any) -> list[str]:
    """This run against OLD (a report_data.Against): one row per pair, and the cells in one run only."""
    out = [f"### Against {_md(ag.name)}", ""]
    if ag.error:
        out += [f"> This run could not be compared with {_md(ag.name)}: {_md(ag.error)}", ""]
    if not len(ag.pairs):
        return out + ["No cells to pair."]
    out += [f"{_md(against_counts(ag.pairs, ag.name))}. Ratios: this run ÷ {_md(ag.name)}, 95% CI; verdict: this "
            f"run's logprobs against {_md(ag.name)}'s, with its noise floor; speedup: against each run's own "
            "baseline, old → new.", ""]
    shown, note = against_rows(ag.pairs)
    if note:
        out += [f"> {note}", ""]
    multi_len = ag.pairs[["input_len", "output_len"]].drop_duplicates().shape[0] > 1

    def ratio(r: dict, name: str) -> str:
        return " ".join(x for x in (ratio_text(r, name), call_text(r, name)) if x)

    with_tasks = "task_verdict" in ag.pairs and ag.pairs.task_verdict.notna().any()
    with_sampling = "sampling_verdict" in ag.pairs and ag.pairs.sampling_verdict.notna().any()
    head = ["engine config", "load"] + (["in", "out"] if multi_len else []) + [
        "verdict"] + (["tasks"] if with_tasks else []) + (["sampling"] if with_sampling else []) + [
        "KL mean", "speedup (old → new)", "out tok/s ratio [95% CI]", "TTFT p99 ratio [95% CI]",
        "TPOT p50 ratio [95% CI]", "peak mem ratio", "reason", "what changed"]
    out += ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in shown.to_dict("records"):
        row = [r["config"], r["load_label"]] + ([r["input_len"], r["output_len"]] if multi_len else []) + [
            f"**{r['verdict']}**" if r["verdict"] == "lossy" else r["verdict"]] + (
            [_task_word(r.get("task_verdict"))] if with_tasks else []) + (
            [as_text(r.get("sampling_verdict"))] if with_sampling else []) + [sci(r.get("kl_mean")), moved_text(r),
            ratio(r, "tok_s"), ratio(r, "ttft_p99"), ratio(r, "tpot_p50"),
            f"{num(r.get('mem_ratio'), '.3f')}x" if num(r.get("mem_ratio")) else "", first_line(r.get("verdict_reason"), 120),
            as_text(r.get("changed"))]
        out.append("| " + " | ".join(_md(x) for x in row) + " |")
    return out
