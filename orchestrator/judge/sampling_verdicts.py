"""The sampling layer's verdicts, from the stored samples table alone (orchestrator/judge/sampling_stats.py).

Per cell, against its baseline (the baseline config's cell, as the other layers pick it):
  repeatable      share of (prompt, seed) samples identical between the cell's repeat 0 and 1: does a
                  seed give the same sample twice in this engine? (a finding in itself)
  seed by seed    where both sides promise reproducibility (the same framework, each repeatable): the
                  share of samples identical to the baseline's with the same prompt and seed, and the
                  mean first differing token among those that differ; seed_verdict identical | differs,
                  n/a where identity is not promised (another engine, or a side that is not repeatable)
  distribution    always, two tests (orchestrator/judge/sampling_stats.py), each with its n and p:
                  dist_*   the seed-level permutation test on each sample's mean raw logprob;
                  first_*  the first sampled token of each prompt against the baseline's next-token
                           logprobs after the cell's sampler (in the cell engine's order), where the
                           baseline stored enough candidates to know that distribution (else n/a, why);
                  dist_verdict 'different' when either p < tolerances.sampling_alpha / (tests run)
                  (Bonferroni: the verdict's false-alarm rate stays at sampling_alpha), else 'same distribution'
  seeds_needed    seeds for the two-sample test to find a shift of tolerances.sampling_shift nats
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from adapters import ADAPTERS
from adapters.contract.specs import SamplerSettings
from orchestrator.judge.analysis import run_settings
from orchestrator.judge.sampling_stats import first_token_test, permutation_test, sampler_probs, seeds_to_detect
from orchestrator.judge.task_verdicts import layer_cells, with_baselines, with_old_partners
from orchestrator.matrix.models import AXES, Tolerances
from orchestrator.store.manifest import Manifest
from orchestrator.store.run_store import RunStore

SAMPLING_VERDICTS = ("identical", "same distribution", "different", "n/a")


def _sampler(manifest: Manifest) -> SamplerSettings | None:
    s = manifest.sampling
    return SamplerSettings(**s.model_dump(include=set(SamplerSettings.model_fields))) if s else None


def _first_token(base: pd.DataFrame, first: pd.DataFrame, framework: str, settings: SamplerSettings | None) -> dict:
    """The first-token test's columns (first_*), or first_reason saying why it did not run."""
    order = getattr(ADAPTERS.get(framework), "sampler_order", None)
    if settings is None:
        return {"first_reason": "the run's matrix has no measure.sampling settings"}
    if order is None:
        return {"first_reason": f"{framework}'s sampler order is not known"}
    dists = {}
    for prompt, rows in base[base.repeat == 0].groupby("prompt_index"):
        ids, lps = rows.next_topk_ids.iloc[0], rows.next_topk_logprobs.iloc[0]
        if ids is None or not len(ids):
            dists[prompt] = "the baseline stored no next-token candidates (measure.sampling.next_top_k)"
            continue
        kept, q, why = sampler_probs(np.asarray(ids), np.asarray(lps), order=order, **settings.model_dump())
        dists[prompt] = why if why else (kept, q)
    draws = {p: np.array([t[0] for t in g.ids]) for p, g in first.groupby("prompt_index")}
    t = first_token_test(dists, draws)
    skipped = "; ".join(sorted({w for w in (t.skipped.values() if t else
                                            [d for d in dists.values() if isinstance(d, str)])}))
    if t is None:
        return {"first_reason": f"no prompt's next-token distribution is known: {skipped}" if skipped else
                "no prompt in common"}
    return {"first_p": t.p_value, "first_n": t.n, "first_prompts": t.prompts, "first_outside": t.outside,
            "first_test": t.test, "first_reason": (f"{len(t.skipped)} prompt(s) not tested: {skipped}" if t.skipped
                                                   else None)}


def _samples(root: Path) -> pd.DataFrame:
    t = RunStore(root).read_samples().to_pandas()
    t["stat"] = [float(np.mean(x)) if len(x) else math.nan for x in t.logprobs]
    t["ids"] = [tuple(x) for x in t.token_ids]
    return t


def _repeatable(s: pd.DataFrame) -> float | None:
    r0, r1 = (s[s.repeat == r].set_index(["prompt_index", "seed"]).ids for r in (0, 1))
    both = r0.index.intersection(r1.index)
    return float((r0.reindex(both) == r1.reindex(both)).mean()) if len(both) else None


def _first_div(a: tuple, b: tuple) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def sampling_verdicts(cells: pd.DataFrame, samples: pd.DataFrame, base_samples: pd.DataFrame,
                      base_cells: pd.DataFrame, tol: Tolerances, settings: SamplerSettings | None = None) -> pd.DataFrame:
    """`cells`: cell_id, axes, status, baseline_cell_id (a cell of the baseline run). One row per ok cell
    with samples."""
    by_cell = {cid: g for cid, g in samples.groupby("cell_id", sort=False)}
    by_base = {cid: g for cid, g in base_samples.groupby("cell_id", sort=False)}
    base_fw = base_cells.set_index("cell_id").framework
    rows = []
    for c in cells.to_dict("records"):
        mine = by_cell.get(c["cell_id"])
        if c["status"] != "ok" or mine is None:
            continue
        row = {k: c[k] for k in ("cell_id", *AXES)} | {"baseline_cell_id": c["baseline_cell_id"]}
        first = mine[mine.repeat == 0]
        row["samples_n"], row["repeatable"] = len(first), _repeatable(mine)
        row["seeds_needed"] = seeds_to_detect(first.stat.to_numpy(), first.prompt_index.to_numpy(),
                                              first.seed.to_numpy(), tol.sampling_shift, tol.sampling_alpha)
        base = by_base.get(c["baseline_cell_id"])
        if base is None:
            rows.append(row | {"seed_verdict": "n/a", "dist_verdict": "n/a", "sampling_reason":
                               c.get("baseline_match") or "the baseline cell has no samples"})
            continue
        b0 = base[base.repeat == 0]
        test = permutation_test(b0.stat.to_numpy(), b0.prompt_index.to_numpy(), b0.seed.to_numpy(),
                                first.stat.to_numpy(), first.prompt_index.to_numpy(), first.seed.to_numpy())
        row |= {"dist_shift": test.shift, "dist_p": test.p_value, "dist_n_base": test.n_base, "dist_n_cell": test.n_cell,
                "dist_seeds_base": test.seeds_base, "dist_seeds_cell": test.seeds_cell, "dist_test": test.test}
        row |= _first_token(b0, first, c["framework"], settings)
        ps = [x for x in (test.p_value, row.get("first_p")) if x is not None and np.isfinite(x)]
        level = tol.sampling_alpha / max(len(ps), 1)
        row["dist_verdict"] = "different" if ps and min(ps) < level else "same distribution"
        # a shift too small for these seeds: how many would find one of this size (not a verdict, a size)
        row["seeds_for_shift"] = seeds_to_detect(first.stat.to_numpy(), first.prompt_index.to_numpy(),
                                                 first.seed.to_numpy(), abs(test.shift), level) \
            if np.isfinite(test.shift) and test.shift else None
        undetected = (f"no difference detected at n={test.n_cell} ({test.seeds_cell} seeds)"
                      + (f", ~{row['seeds_for_shift']} seeds needed to detect a shift of this size"
                         if row["seeds_for_shift"] else "") + "; ") if row["dist_verdict"] == "same distribution" else ""
        dist = (f"{undetected}{row['dist_verdict']} (each test at {level:.3g}: two-sample p={test.p_value:.3g}, shift "
                f"{test.shift:+.4f} nats/token, {test.n_cell} vs {test.n_base} samples, {test.seeds_cell} vs "
                f"{test.seeds_base} seeds, {test.test}; ")
        if "first_p" in row:
            dist += (f"first token p={row['first_p']:.3g}, {row['first_n']} draws over {row['first_prompts']} "
                     f"prompt(s)" + (f", {row['first_outside']} outside the baseline's kept tokens"
                                     if row["first_outside"] else "") + f", {row['first_test']}"
                     + (f"; {row['first_reason']}" if row.get("first_reason") else "") + ")")
        else:
            dist += f"first token n/a: {row['first_reason']})"
        promised = base_fw.get(c["baseline_cell_id"]) == c["framework"] and row["repeatable"] == 1.0 \
            and _repeatable(base) == 1.0
        if promised:
            a = b0.set_index(["prompt_index", "seed"]).ids
            b = first.set_index(["prompt_index", "seed"]).ids
            both = a.index.intersection(b.index)
            same = (a.reindex(both) == b.reindex(both)).to_numpy()
            divs = [_first_div(x, y) for x, y, s in zip(a.reindex(both), b.reindex(both), same) if not s]
            row |= {"seed_identical": float(same.mean()) if len(both) else None,
                    "seed_first_div_mean": float(np.mean(divs)) if divs else None,
                    "seed_verdict": "identical" if len(both) and same.all() else "differs"}
            seed = (f"seed by seed: {int(same.sum())} of {len(both)} samples identical to the baseline's"
                    + (f" (first difference at token {np.mean(divs):.1f} on average)" if divs else ""))
        else:
            row["seed_verdict"] = "n/a"
            why = "another engine" if base_fw.get(c["baseline_cell_id"]) != c["framework"] else \
                "a side whose seeds do not repeat"
            seed = f"seed by seed: not promised ({why})"
        row["sampling_verdict"] = "identical" if row["seed_verdict"] == "identical" else row["dist_verdict"]
        row["sampling_reason"] = f"{seed}; distribution: {dist}; repeatable within the cell: " + (
            "n/a (one repeat)" if row["repeatable"] is None else f"{row['repeatable']:.0%}")
        rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return pd.DataFrame(columns=["cell_id", *AXES, "sampling_verdict", "sampling_reason"])
    out["sampling_verdict"] = out.get("sampling_verdict", pd.Series(index=out.index, dtype=object)).fillna("n/a")
    return out.sort_values([*AXES, "cell_id"], kind="stable", ignore_index=True)


def analyse_sampling(run_dir: str | Path, baseline: dict | None = None, tolerances: Tolerances | None = None) -> pd.DataFrame:
    root = Path(run_dir)
    manifest = RunStore(root).read_manifest()
    selector, tol = run_settings(manifest, baseline, tolerances)
    samples = _samples(root)
    cells = with_baselines(layer_cells(root), samples.cell_id, selector, "samples")
    return sampling_verdicts(cells, samples, samples, cells, tol, _sampler(manifest))


def compare_sampling_runs(new_dir: str | Path, old_dir: str | Path, pairs: pd.DataFrame,
                          tolerances: Tolerances | None = None) -> pd.DataFrame:
    """NEW's cells against their partners in OLD (cell_id -> baseline_cell_id, as compare_runs pairs them)."""
    new_root, old_root = Path(new_dir), Path(old_dir)
    manifest = RunStore(new_root).read_manifest()
    _, tol = run_settings(manifest, {}, tolerances)
    return sampling_verdicts(with_old_partners(new_root, old_root, pairs), _samples(new_root), _samples(old_root),
                             layer_cells(old_root), tol, _sampler(manifest))
