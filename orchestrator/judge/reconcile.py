"""Where a cell's layers disagree, one line that says how both can be true: logits that moved while no
greedy token and no task item did, logits within the tolerances while a task regressed or the samples
differ. `bench compare` prints the lines below its table; report.html and report.md list them in the
summary. The figures are the layers' own (orchestrator/judge/: analysis, task_verdicts,
sampling_verdicts): nothing is computed again here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.values import finite

if TYPE_CHECKING:
    import pandas as pd

_MOVED = ("near-lossless", "lossy")
_KEPT = ("identical", "lossless")


def _num(v) -> float | None:
    return float(v) if finite(v) else None


def _e(v: float) -> str:
    """3e-2, 1.5e-2, 0.25: a figure in a sentence."""
    if v == 0 or 1e-2 <= abs(v) < 1e3:
        return f"{v:.2g}"
    mant, exp = f"{v:.1e}".split("e")
    return f"{mant.rstrip('0').rstrip('.')}e{int(exp)}"


def _tasks_unmoved(cell: dict, tasks: list[dict], alpha: float) -> str | None:
    """Logits moved, no task regressed or improved: what the tasks saw, and what they could miss."""
    judged = [t for t in tasks if t.get("task_verdict") in ("no change", "not distinguishable")]
    if not judged or len(judged) < len([t for t in tasks if t.get("task_verdict") != "n/a"]):
        return None
    n = min(int(t["n_paired"]) for t in judged if _num(t.get("n_paired")) is not None) if any(
        _num(t.get("n_paired")) is not None for t in judged) else None
    flipped = sum(int(_num(t.get("worse")) or 0) + int(_num(t.get("better")) or 0) for t in judged)
    names = ", ".join(sorted({str(t["task"]) for t in judged}))
    at = f" at n={n}" if n is not None else ""
    kl = _num(cell.get("kl_mean"))
    head = f"logits moved ({'KL ' + _e(kl) if kl is not None else cell['verdict']}, {cell['verdict']})"
    greedy = _num(cell.get("greedy_match"))
    text = " no greedy token changed and" if greedy == 1.0 else ""
    if flipped == 0:
        body = f"{head} but{text} no task item flipped{at} ({names}): it does not reach the tasks measured"
    else:
        body = (f"{head}; {flipped} task item(s) flipped{at} ({names}), within chance: no paired test finds a "
                "change")
    widest = max(judged, key=lambda t: _num(t.get("mde")) or 0.0)
    mde, rel = _num(widest.get("mde")), _num(widest.get("mde_rel"))
    if mde:
        miss = f"a drop under {_e(mde)}" + (f" ({rel:.1%} of the baseline's {widest.get('metric') or 'score'})"
                                               if rel is not None else "")
        return f"{body}, which could miss {miss} on {widest['task']}"
    if n and all(t.get("test") == "mcnemar-exact" for t in judged):
        # no discordant item: the power formula has no spread to work from. McNemar's exact test needs k
        # items flipped one way (p = 2 x 0.5^k) before it calls a change: fewer pass unseen. The level is the
        # family's (orchestrator/judge/families.py): what a test the family did not call had to beat
        levels = [x for x in (_num(t.get("family_level")) for t in judged) if x is not None]
        level = min(levels) if levels else alpha
        k = next(k for k in range(1, 64) if 2 * 0.5 ** k < level)
        return (f"{body}, which could miss a drop of up to {k - 1} items ({(k - 1) / n:.1%}; McNemar needs {k} "
                f"one way at p<{level:.3g}, the task family's level)")
    return body


def _task_moved(cell: dict, tasks: list[dict]) -> str | None:
    """Logits within the tolerances, yet a task regressed or improved."""
    moved = [t for t in tasks if t.get("task_verdict") in ("regressed", "improved")]
    if not moved:
        return None
    t = moved[0]
    change = _num(t.get("change"))
    lo, hi = _num(t.get("change_lo")), _num(t.get("change_hi"))
    fig = f" ({t.get('metric') or 'score'} {change:+.3g}" + (f" [{lo:+.3g}, {hi:+.3g}]" if lo is not None and hi is not None
                                                           else "") + ")" if change is not None else ""
    more = f" (+{len(moved) - 1} more)" if len(moved) > 1 else ""
    return (f"logits {cell['verdict']} but {t['task']} {t['task_verdict']}{fig}{more}: the tolerances let through "
            "a change the task sees (or the task's generation diverged where the logits agree)")


def _samples_differ(cell: dict, sampling: dict | None) -> str | None:
    if not sampling or sampling.get("sampling_verdict") != "different":
        return None
    p = _num(sampling.get("dist_p"))
    return (f"logits {cell['verdict']} but the seeded samples differ" + (f" (p={p:.2g})" if p is not None else "")
            + ": the same model, another sampling path (seeds, sampler order, batch-dependent numerics)")


def reconcile(df: pd.DataFrame, tv: pd.DataFrame | None = None, sv: pd.DataFrame | None = None,
              alpha: float = 0.05) -> dict[str, str]:
    """cell_id -> one line, for each cell whose layers disagree (none: the layers agree or were not run);
    alpha: the task layer's test level (tolerances.task_alpha)."""
    tasks: dict[str, list[dict]] = {}
    if tv is not None and len(tv):
        for t in tv.to_dict("records"):
            tasks.setdefault(t["cell_id"], []).append(t)
    samples = {r["cell_id"]: r for r in sv.to_dict("records")} if sv is not None and len(sv) else {}
    out = {}
    for cell in df.to_dict("records"):
        cid, verdict = cell["cell_id"], cell.get("verdict")
        if cell.get("baseline_cell_id") == cid:   # the baseline against itself
            continue
        line = None
        if verdict in _MOVED:
            line = _tasks_unmoved(cell, tasks.get(cid, []), alpha)
        elif verdict in _KEPT:
            line = _task_moved(cell, tasks.get(cid, [])) or _samples_differ(cell, samples.get(cid))
        if line:
            out[cid] = line
    return out


def cell_name(r: dict) -> str:
    wl = r.get("workload")
    return f"{r['framework']}/{r['model']}/{r['quantization']}/{r['flags']}" + (f" [{wl}]" if isinstance(wl, str) else "")


def disagree_lines(df: pd.DataFrame, found: dict[str, str]) -> list[str]:
    """The lines `bench compare` prints: 'layers disagree:' and one line per such cell (`found`: reconcile's). Cells
    that share a configuration and differ by batch (or load, env, lengths) are named with what tells them apart."""
    if not found:
        return []
    from orchestrator.matrix.cells import load_label

    rows = {r["cell_id"]: r for r in df.to_dict("records")}

    def load(r: dict) -> str:
        env = r.get("env")
        return (load_label(r.get("mode") or "offline", r["batch_size"], r.get("request_rate"), r.get("load"))
                + (f" env {env}" if isinstance(env, str) else ""))

    names = {cid: cell_name(rows[cid]) for cid in found}
    for extra in (load, lambda r: f"in{r.get('input_len')}/out{r.get('output_len')}"):
        twins = {n for n in names.values() if list(names.values()).count(n) > 1}
        names = {cid: f"{n} {extra(rows[cid])}" if n in twins else n for cid, n in names.items()}
    return ["layers disagree:"] + [f"  {names[cid]}: {line}" for cid, line in found.items()]


def disagreements(df: pd.DataFrame, tasks, sampling, alpha: float) -> list[tuple[str, str]]:
    """report.html and report.md: (cell label, line) per cell whose layers disagree; tasks and sampling:
    the report's TaskLayer and SamplingLayer (or None)."""
    if "verdict" not in df or not len(df):
        return []
    found = reconcile(df, tasks.table if tasks is not None else None,
                      sampling.table if sampling is not None else None, alpha)
    labels = dict(zip(df.cell_id, df["label"] if "label" in df else df.cell_id))
    return [(str(labels.get(cid, cid)), line) for cid, line in found.items()]
