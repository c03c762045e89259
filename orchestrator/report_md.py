"""report.md: status and verdict counts, the verdict/speedup table and the cells that are not ok,
for a pull request or an issue; with --against OLD, the table of this run against OLD as well."""

from __future__ import annotations

from typing import Any

import pandas as pd

from orchestrator import report_data
from orchestrator.report_data import (_against_counts, _call, _moved, _num, _ratio, _sci, _speed, _status_counts,
                                      _text, _ttft, _ttft_disagrees, _verdict_counts, _why, against_rows, first_line,
                                      table_cells)


def _md(v: Any) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def render_markdown(df: pd.DataFrame, manifest: dict, run_name: str, analysis_error: str | None = None,
                    against: Any = None) -> str:
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
    if len(bad) > report_data.MAX_LISTED:
        why = pd.Series([f"{st}: {first_line(r) or '-'}" for st, r in zip(bad.status, bad.status_reason)])
        out += ["", f"**{len(bad):,} cell(s) not ok**, by status and reason:", ""]
        out += [f"- {n:,} × {_md(w)}" for w, n in why.value_counts().head(report_data.MAX_LISTED).items()]
    elif len(bad):
        out += ["", f"**{len(bad)} cell(s) not ok:**", ""]
        out += [f"- `{r['cell_id']}` {_md(r['label'])}: {r['status']}: {_md(first_line(r.get('status_reason')) or '-')}"
                for r in bad.to_dict("records")]
    if against is not None:
        out += ["", *_against(against)]
    return "\n".join(out) + "\n"


def _against(ag: Any) -> list[str]:
    """This run against OLD (a report_data.Against): one row per pair, and the cells in one run only."""
    out = [f"### Against {_md(ag.name)}", ""]
    if ag.error:
        out += [f"> This run could not be compared with {_md(ag.name)}: {_md(ag.error)}", ""]
    if not len(ag.pairs):
        return out + ["No cells to pair."]
    out += [f"{_md(_against_counts(ag.pairs, ag.name))}. Ratios: this run ÷ {_md(ag.name)}, 95% CI; verdict: this "
            f"run's logprobs against {_md(ag.name)}'s, with its noise floor; speedup: against each run's own "
            "baseline, old → new.", ""]
    shown, note = against_rows(ag.pairs)
    if note:
        out += [f"> {note}", ""]
    multi_len = ag.pairs[["input_len", "output_len"]].drop_duplicates().shape[0] > 1

    def ratio(r: dict, name: str) -> str:
        return " ".join(x for x in (_ratio(r, name), _call(r, name)) if x)

    head = ["engine config", "load"] + (["in", "out"] if multi_len else []) + [
        "verdict", "KL mean", "speedup (old → new)", "out tok/s ratio [95% CI]", "TTFT p99 ratio [95% CI]",
        "TPOT p50 ratio [95% CI]", "peak mem ratio", "reason", "what changed"]
    out += ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in shown.to_dict("records"):
        row = [r["config"], r["load_label"]] + ([r["input_len"], r["output_len"]] if multi_len else []) + [
            f"**{r['verdict']}**" if r["verdict"] == "lossy" else r["verdict"], _sci(r.get("kl_mean")), _moved(r),
            ratio(r, "tok_s"), ratio(r, "ttft_p99"), ratio(r, "tpot_p50"),
            f"{_num(r.get('mem_ratio'), '.3f')}x" if _num(r.get("mem_ratio")) else "", first_line(r.get("reason"), 120),
            _text(r.get("changed"))]
        out.append("| " + " | ".join(_md(x) for x in row) + " |")
    return out
