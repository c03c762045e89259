"""The sampling layer's verdicts, from the stored samples table alone (orchestrator/judge/sampling_stats.py).

Per cell, against its baseline (the baseline config's cell, as the other layers pick it):
  repeatable      share of (prompt, seed) samples identical between the cell's repeat 0 and 1: does a
                  seed give the same sample twice in this engine? (a finding in itself)
  seed by seed    where both sides are the same framework and each is repeatable: the share of samples
                  identical to the baseline's with the same prompt and seed, and the mean first differing
                  token among those that differ; seed_verdict identical | differs where the engine promises
                  it (orchestrator/judge/seed_promises.py: its documentation, per version), identical or n/a
                  where it does not (a difference there is expected, not a finding)
  distribution    always, two tests (orchestrator/judge/sampling_stats.py), each with its n and p, each at
                  level = tolerances.sampling_alpha / (tests run) (Bonferroni):
                  dist_*    the seed-level permutation test on each sample's mean raw logprob: the
                            distribution as served, the model and the sampler's implementation together
                            (served_verdict); both sides' samples scored by the baseline's engine, teacher
                            forced after the run's cells (rescored.parquet: dist_scored_by "baseline engine"),
                            so one model grades both; else each under the engine that drew it ("own engine",
                            dist_rescore_reason says why; across runs always); dist_shift_own: the shift the
                            engines' own logprobs show;
                  whole_*   where the baseline's engine scored the samples with its candidates: every
                            sampled token against the baseline's distribution after the cell's sampler in the
                            cell engine's own order (sampling_stats.whole_sample_test): the cell's draws
                            against the baseline's model, whatever the two samplers do (model_verdict);
                  first_*   the first sampled token of each prompt against the baseline's stored next-token
                            logprobs, the same way: the model test where no rescoring is (n/a, why, where the
                            baseline stored too few candidates to know that distribution); model_test, model_p:
                            the one that decides;
                  dist_verdict  different: the model test finds a difference, or the served one does and the
                                two engines sample alike or the cell was asked for other sampler
                                settings (a flag set's `sampling`: settings_changed); sampler differs: only the served test finds one and
                                the engines' samplers give another distribution at these settings (the
                                reason names the steps); not distinguishable: no test finds one, but the
                                served test could not have seen a shift of tolerances.sampling_shift (80%
                                power); else same distribution
  seeds_needed    seeds for the served test to find a shift of tolerances.sampling_shift at its level
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from adapters import ADAPTERS
from adapters.contract.seed_power import sample_statistic, seeds_to_detect
from adapters.contract.specs import SamplerSettings
from orchestrator.judge.analysis import run_settings
from orchestrator.judge.families import BH, family
from orchestrator.judge.sampling_stats import (
    first_token_test,
    order_difference,
    permutation_test,
    sampler_probs,
    whole_sample_test,
)
from orchestrator.judge.seed_promises import seed_promise
from orchestrator.judge.task_verdicts import layer_cells, with_baselines, with_old_partners
from orchestrator.matrix.models import AXES, Tolerances
from orchestrator.store.manifest import Manifest
from orchestrator.store.run_store import RunStore
from orchestrator.store.rescored_file import read_rescored
from orchestrator.store.schema import json_object

SAMPLING_VERDICTS = ("identical", "same distribution", "not distinguishable", "sampler differs", "different", "n/a")


def _sampler(manifest: Manifest, cell: dict | None) -> SamplerSettings | None:
    """The sampler settings a cell drew with: measure.sampling and its flag set's override."""
    s = manifest.sampling_for(cell["framework"], cell["flags"]) if cell else manifest.sampling
    return SamplerSettings(**s.model_dump(include=set(SamplerSettings.model_fields))) if s else None


def _settings_change(settings: SamplerSettings | None, base: SamplerSettings | None) -> str | None:
    """'top_p 0.95 -> 0.5' where the cell was asked to sample otherwise than its baseline."""
    if settings is None or base is None or settings == base:
        return None
    a, b = base.model_dump(), settings.model_dump()
    return ", ".join(f"{k} {a[k]:g} -> {b[k]:g}" for k in a if a[k] != b[k])


def _order(framework: str) -> tuple[str, ...] | None:
    return getattr(ADAPTERS.get(framework), "sampler_order", None)


def _first_token(base: pd.DataFrame, first: pd.DataFrame, framework: str, base_framework: str | None,
                 settings: SamplerSettings | None) -> dict:
    """The model test's columns (model_*), or first_reason saying why it did not run; and, where the
    baseline's engine orders its sampler otherwise, how many prompts keep other tokens (kept_differs)."""
    order, base_order = _order(framework), _order(base_framework or "")
    if settings is None:
        return {"first_reason": "the run's matrix has no measure.sampling settings"}
    if order is None:
        return {"first_reason": f"{framework}'s sampler order is not known"}
    dists, kept = {}, []
    for prompt, rows in base[base.repeat == 0].groupby("prompt_index"):
        ids, lps = rows.next_topk_ids.iloc[0], rows.next_topk_logprobs.iloc[0]
        if ids is None or not len(ids):
            dists[prompt] = "the baseline stored no next-token candidates (measure.sampling.next_top_k)"
            continue
        ids, lps = np.asarray(ids), np.asarray(lps)
        mine, q, why = sampler_probs(ids, lps, order=order, **settings.model_dump())
        dists[prompt] = why if why else (mine, q)
        if not why and base_order and base_order != order:
            theirs, _, why_b = sampler_probs(ids, lps, order=base_order, **settings.model_dump())
            if not why_b and len(theirs) != len(mine):
                kept.append(f"{len(theirs)} -> {len(mine)}")
    draws = {p: np.array([t[0] for t in g.ids]) for p, g in first.groupby("prompt_index")}
    t = first_token_test(dists, draws)
    skipped = "; ".join(sorted({w for w in (t.skipped.values() if t else
                                            [d for d in dists.values() if isinstance(d, str)])}))
    out = {"kept_differs": kept}
    if t is None:
        return out | {"first_reason": f"no prompt's next-token distribution is known: {skipped}" if skipped else
                      "no prompt in common"}
    return out | {"first_p": t.p_value, "first_n": t.n, "first_prompts": t.prompts, "first_outside": t.outside,
                  "first_test": t.test, "first_reason": (f"{len(t.skipped)} prompt(s) not tested: {skipped}"
                                                         if t.skipped else None)}


def _sampler_difference(framework: str, base_framework: str | None, settings: SamplerSettings | None,
                        kept: list[str]) -> str | None:
    """'llamacpp applies top_p before temperature, hf after ...' where the two engines' samplers give
    another distribution at these settings; None where they sample alike (or it is not known)."""
    order, base_order = _order(framework), _order(base_framework or "")
    if settings is None or not order or not base_order or framework == base_framework:
        return None
    pair = order_difference(order, base_order, **settings.model_dump())
    if pair is None:
        return None
    x, y = pair
    return (f"{framework} applies {x} before {y}, {base_framework} after"
            + (f" (kept tokens at the first position, {base_framework} -> {framework}: {', '.join(kept)})"
               if kept else ""))


def _samples(root: Path) -> pd.DataFrame:
    """The stored samples with `stat`: each sample's mean raw logprob under the engine that drew it."""
    t = RunStore(root).read_samples().to_pandas()
    t["stat"] = [sample_statistic(x) for x in t.logprobs]
    t["ids"] = [tuple(x) for x in t.token_ids]
    return t


_SAMPLE_KEY = ["cell_id", "prompt_index", "seed", "ids"]


def _rescored(root: Path) -> dict[str | None, pd.DataFrame]:
    """rescored.parquet's rows by the cell whose samples they score (None: an empty frame of the columns), each
    row with its scorer (`r_scorer`: its engine_key), `r_stat` under the scorer, its candidates, `r_reason` why
    a sample was not scored; matched to samples on their ids."""
    r = read_rescored(root).to_pandas()
    r = pd.DataFrame({"cell_id": r.cell_id, "prompt_index": r.prompt_index, "seed": r.seed,
                      "ids": [tuple(x) for x in r.token_ids], "r_scorer": r.scorer_engine_key, "r_reason": r.reason,
                      "r_stat": [math.nan if x is None else sample_statistic(x) for x in r.logprobs],
                      "r_topk_ids": r.topk_ids, "r_topk_logprobs": r.topk_logprobs})
    return {None: r.iloc[:0], **dict(tuple(r.groupby("cell_id", sort=False)))}


def _with_scores(b0: pd.DataFrame, first: pd.DataFrame, rescored: dict[str | None, pd.DataFrame] | None,
                 base_cell: dict | None):
    """Both sides' repeat-0 samples with the baseline's engine's scores of them where it scored them (any
    scorer's reason where none did); unchanged without rescored rows (across runs)."""
    if rescored is None:
        return b0, first
    rows = pd.concat([rescored[None], *(rescored[c] for c in {*b0.cell_id, *first.cell_id} if c in rescored)])
    mine = rows[rows.r_scorer == (base_cell or {}).get("engine_key")]
    if mine.empty:   # no row of this baseline's engine: another scorer's reason, or none
        mine = rows.drop(columns=["r_stat", "r_topk_ids", "r_topk_logprobs"])
    mine = mine.drop_duplicates(_SAMPLE_KEY, keep="last")
    return b0.merge(mine, on=_SAMPLE_KEY, how="left"), first.merge(mine, on=_SAMPLE_KEY, how="left")


NOT_RESCORED = ("the baseline's engine did not score these samples (measure.sampling.rescore off, or a run "
                "stored before rescoring)")


def _scored_by(b0: pd.DataFrame, first: pd.DataFrame, base_cell: dict | None) -> tuple[str, str | None]:
    """The per-sample statistic the served test compares: `r_stat` where the baseline's own engine scored both
    sides' samples (one model's probabilities), else `stat` (each sample under the engine that drew it) and why."""
    if "r_scorer" not in b0:
        return "stat", "across runs each sample is scored by the engine that drew it (two runs' scorers may differ)"
    both = pd.concat([b0, first])
    key = (base_cell or {}).get("engine_key")
    if "r_stat" in both and (both.r_scorer == key).all() and np.isfinite(both.r_stat.to_numpy(float)).all():
        return "r_stat", None
    said = both.r_reason.dropna()
    if len(said):
        return "stat", f"the baseline's engine could not score them: {said.iloc[0].splitlines()[0][:300]}"
    if both.r_scorer.notna().all():
        return "stat", "the run's rescoring used its matrix's baseline engine, not this baseline's"
    return "stat", NOT_RESCORED


def _cells(root: Path) -> pd.DataFrame:
    """The layer's cells with the engine versions each recorded (what its seed promise is read for)."""
    versions = RunStore(root).read_cells_table(["cell_id", "versions"]).to_pandas()
    versions["versions"] = [json_object(v) for v in versions.versions]
    return layer_cells(root).merge(versions, on="cell_id", how="left")


def _repeatable(s: pd.DataFrame) -> float | None:
    r0, r1 = (s[s.repeat == r].set_index(["prompt_index", "seed"]).ids for r in (0, 1))
    both = r0.index.intersection(r1.index)
    return float((r0.reindex(both) == r1.reindex(both)).mean()) if len(both) else None


def _first_div(a: tuple, b: tuple) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _has_candidates(samples: pd.DataFrame) -> bool:
    return bool(len(samples)) and samples.next_topk_ids.iloc[0] is not None and len(samples.next_topk_ids.iloc[0]) > 0


def _seeds_needed(first: pd.DataFrame, tol: Tolerances, level: float) -> int | None:
    """Seeds each side for the served test to find a shift of the tolerance, at the level it runs at."""
    return seeds_to_detect(first.stat.to_numpy(), first.prompt_index.to_numpy(), first.seed.to_numpy(),
                           tol.sampling_shift, level)


def _distribution(row: dict, b0: pd.DataFrame, first: pd.DataFrame, base_cell: dict | None,
                  settings: SamplerSettings | None, changed: str | None, tol: Tolerances):
    """Both tests into `row`, and its p (sampling_p); returns finish(cell_alpha): the distribution verdict into
    `row` at the level the family gives the cell, which returns the reason's distribution part."""
    base_fw = (base_cell or {}).get("framework")
    col, not_rescored = _scored_by(b0, first, base_cell)
    own = None
    if col == "r_stat":    # the shift each engine's own logprobs show, beside it (a shift they hide is a finding)
        own = permutation_test(b0.stat.to_numpy(), b0.prompt_index.to_numpy(), b0.seed.to_numpy(),
                               first.stat.to_numpy(), first.prompt_index.to_numpy(), first.seed.to_numpy()).shift
        b0, first = b0.assign(stat=b0.r_stat), first.assign(stat=first.r_stat)
    row |= {"dist_scored_by": "baseline engine" if col == "r_stat" else "own engine", "dist_shift_own": own,
            "dist_rescore_reason": not_rescored}
    test = permutation_test(b0.stat.to_numpy(), b0.prompt_index.to_numpy(), b0.seed.to_numpy(),
                            first.stat.to_numpy(), first.prompt_index.to_numpy(), first.seed.to_numpy())
    row |= {"dist_shift": test.shift, "dist_p": test.p_value, "dist_n_base": test.n_base,
            "dist_n_cell": test.n_cell, "dist_seeds_base": test.seeds_base, "dist_seeds_cell": test.seeds_cell,
            "dist_test": test.test}
    row |= _first_token(b0, first, row["framework"], base_fw, settings)
    kept = row.pop("kept_differs", [])
    # the model test: every sampled token where the baseline's engine scored the samples with candidates,
    # else the first token alone
    row |= _whole_sample(first, row["framework"], settings) if col == "r_stat" else \
        {"whole_reason": "the baseline's engine did not score the samples"}
    row["model_test"] = "whole sample" if "whole_p" in row else "first token" if "first_p" in row else None
    row["model_p"] = row.get("whole_p", row.get("first_p"))
    tests = [x for x in (test.p_value, row["model_p"]) if x is not None and np.isfinite(x)]
    row["sampler_note"] = _sampler_difference(row["framework"], base_fw, settings, kept)
    row["settings_changed"] = changed
    # the cell's p: its tests together (Bonferroni), a member of the layer's family (orchestrator/judge/families.py)
    row["sampling_p"] = min(1.0, len(tests) * min(tests)) if tests else math.nan

    def finish(cell_alpha: float) -> str:
        """The verdict at `cell_alpha`, the level the family gives this cell (each test at it / tests run)."""
        level = cell_alpha / max(len(tests), 1)
        mde = test.detectable_shift(level)
        row.update({"dist_level": level, "dist_detectable": mde, "seeds_needed": _seeds_needed(first, tol, level)})
        served = test.p_value < level if np.isfinite(test.p_value) else False
        model = row.get("model_p") is not None and row["model_p"] < level
        row["served_verdict"] = "different" if served else "n/a" if not np.isfinite(mde) else         "no difference" if mde <= tol.sampling_shift else "not distinguishable"
        row["model_verdict"] = "n/a" if row.get("model_p") is None else "different" if model else "no difference found"
        # asked to sample otherwise (a flag set's override): a served difference is the answer, not the engines'
        if model or (served and (changed or not row["sampler_note"])):
            row["dist_verdict"] = "different"
        elif served:
            row["dist_verdict"] = "sampler differs"
        elif row["served_verdict"] == "no difference":
            row["dist_verdict"] = "same distribution"
        else:
            row["dist_verdict"] = "not distinguishable"
        # how many seeds would find a shift of the size seen (a size, not a verdict)
        row["seeds_for_shift"] = seeds_to_detect(first.stat.to_numpy(), first.prompt_index.to_numpy(),
                                                 first.seed.to_numpy(), abs(test.shift), level) \
            if np.isfinite(test.shift) and test.shift else None
        verdict = word = row["dist_verdict"]
        if changed:
            word += f" (sampler settings against the baseline's: {changed})"
        if verdict == "sampler differs":
            word += f": {row['sampler_note']}; the served distributions differ, the model test does not"
        elif verdict in ("same distribution", "not distinguishable"):
            word += (f": no difference at n={test.n_cell} ({test.seeds_cell} seeds); it could see a shift of "
                     f"{mde:.3g} nats/token (80% power), " + ("within" if mde <= tol.sampling_shift else "more than")
                     + f" the tolerance {tol.sampling_shift:g}"
                     + (f"; ~{row['seeds_needed']} seeds needed" if verdict == "not distinguishable" and row["seeds_needed"]
                        else "")
                     + (f"; ~{row['seeds_for_shift']} seeds would detect the shift seen" if row["seeds_for_shift"]
                        else ""))
            if row["sampler_note"]:
                word += f"; note: {row['sampler_note']}"
        scored = (f"under the baseline's engine, teacher forced ({own:+.4f} under each engine's own logprobs)"
                  if col == "r_stat" else f"under each engine's own logprobs: {not_rescored}")
        out = (f"{word} (each test at {level:.3g}: served two-sample p={test.p_value:.3g}, shift {test.shift:+.4f} "
               f"nats/token {scored}, {test.n_cell} vs {test.n_base} samples, {test.seeds_cell} vs {test.seeds_base} "
               f"seeds, {test.test}; ")
        if "whole_p" in row:
            out += (f"model whole sample p={row['whole_p']:.3g}, {row['whole_n']} tokens of {row['whole_samples']} samples, "
                    f"mean PIT {row['whole_mean_pit']:.3f}" + (f", {row['whole_outside']} outside the baseline's kept "
                                                               f"tokens" if row["whole_outside"] else "")
                    + f", {row['whole_test']}; beside it, ")
        else:
            out += "model " + (f"(whole sample n/a: {row['whole_reason']}) " if col == "r_stat" else "")
        if "first_p" in row:
            out += (f"first token p={row['first_p']:.3g}, {row['first_n']} draws over {row['first_prompts']} "
                    f"prompt(s)" + (f", {row['first_outside']} outside the baseline's kept tokens"
                                    if row["first_outside"] else "") + f", {row['first_test']}"
                    + (f"; {row['first_reason']}" if row.get("first_reason") else "") + ")")
        else:
            out += f"first token n/a: {row['first_reason']})"
        return out

    return finish


def _whole_sample(first: pd.DataFrame, framework: str, settings: SamplerSettings | None) -> dict:
    """The whole-sample model test's columns (whole_*), or whole_reason saying why it did not run."""
    order = _order(framework)
    if settings is None or order is None:
        return {"whole_reason": "no sampler settings" if settings is None else f"{framework}'s sampler order is not known"}
    if any(x is None or not len(x) or not len(x[0]) for x in first.r_topk_ids):
        return {"whole_reason": "the baseline's engine gave no candidates (k = 0)"}
    t = whole_sample_test(((np.stack(list(i)), np.stack(list(lp)), np.asarray(d))
                           for i, lp, d in zip(first.r_topk_ids, first.r_topk_logprobs, first.ids)),
                          order, settings.model_dump())
    if t is None:
        return {"whole_reason": "no position's distribution is known from the stored candidates"}
    return {"whole_p": t.p_value, "whole_n": t.n, "whole_samples": t.samples, "whole_mean_pit": t.mean_pit,
            "whole_outside": t.outside, "whole_skipped": t.skipped, "whole_test": t.test}


def _seed_by_seed(row: dict, c: dict, b0: pd.DataFrame, first: pd.DataFrame, base: pd.DataFrame,
                  base_cell: dict | None) -> str:
    """Seed-by-seed identity into `row` where both sides are one framework and sampler settings and are
    repeatable; the reason part."""
    base_fw = (base_cell or {}).get("framework")
    if base_fw != c["framework"] or row["settings_changed"] or row["repeatable"] != 1.0 or _repeatable(base) != 1.0:
        row["seed_verdict"] = "n/a"
        why = ("another engine" if base_fw != c["framework"] else "other sampler settings" if row["settings_changed"]
               else "a side whose seeds do not repeat")
        return f"seed by seed: not compared ({why})"
    a = b0.set_index(["prompt_index", "seed"]).ids
    b = first.set_index(["prompt_index", "seed"]).ids
    both = a.index.intersection(b.index)
    if not len(both):   # other seeds (another seed_offset): nothing to compare seed by seed
        row["seed_verdict"] = "n/a"
        return "seed by seed: not compared (no (prompt, seed) in common)"
    same = (a.reindex(both) == b.reindex(both)).to_numpy()
    divs = [_first_div(x, y) for x, y, s in zip(a.reindex(both), b.reindex(both), same) if not s]
    promised, why = seed_promise(c["framework"], c.get("versions"), int(c["batch_size"]),
                                 int(base_cell["batch_size"]))
    identical = bool(len(both)) and bool(same.all())
    row |= {"seed_identical": float(same.mean()) if len(both) else None,
            "seed_first_div_mean": float(np.mean(divs)) if divs else None, "seed_promised": promised,
            "seed_verdict": "identical" if identical else "differs" if promised else "n/a"}
    return (f"seed by seed: {int(same.sum())} of {len(both)} samples identical to the baseline's"
            + (f" (first difference at token {np.mean(divs):.1f} on average)" if divs else "") + f", {why}")


def sampling_verdicts(cells: pd.DataFrame, samples: pd.DataFrame, base_samples: pd.DataFrame,
                      base_cells: pd.DataFrame, tol: Tolerances, manifest: Manifest,
                      base_manifest: Manifest, rescored: dict[str | None, pd.DataFrame] | None = None) -> pd.DataFrame:
    """`cells`: cell_id, axes, status, versions, baseline_cell_id (a cell of the baseline run, whose
    settings `base_manifest` holds); `rescored`: the run's samples as its baselines' engines scored them (None
    across runs). One row per ok cell with samples."""
    by_cell = {cid: g for cid, g in samples.groupby("cell_id", sort=False)}
    by_base = {cid: g for cid, g in base_samples.groupby("cell_id", sort=False)}
    base_by_id = base_cells.set_index("cell_id").to_dict("index")
    rows, tested = [], []
    for c in cells.to_dict("records"):
        mine = by_cell.get(c["cell_id"])
        if c["status"] != "ok" or mine is None:
            continue
        row = {k: c[k] for k in ("cell_id", *AXES)} | {"baseline_cell_id": c["baseline_cell_id"]}
        first = mine[mine.repeat == 0]
        row["samples_n"], row["repeatable"] = len(first), _repeatable(mine)
        base = by_base.get(c["baseline_cell_id"])
        if base is None:
            row["seeds_needed"] = _seeds_needed(first, tol, tol.sampling_alpha / (2 if _has_candidates(first) else 1))
            rows.append(row | {"seed_verdict": "n/a", "dist_verdict": "n/a", "sampling_reason":
                               c.get("baseline_match") or "the baseline cell has no samples"})
            continue
        base_cell = base_by_id.get(c["baseline_cell_id"])
        b0, first = _with_scores(base[base.repeat == 0], first, rescored, base_cell)
        settings = _sampler(manifest, c)
        changed = _settings_change(settings, _sampler(base_manifest, base_cell))
        finish = _distribution(row, b0, first, base_cell, settings, changed, tol)
        tested.append((row, finish, _seed_by_seed(row, c, b0, first, base, base_cell)))
        rows.append(row)
    _decide(tested, tol.sampling_alpha)
    out = pd.DataFrame(rows)
    if out.empty:
        return pd.DataFrame(columns=["cell_id", *AXES, "sampling_verdict", "sampling_reason"])
    out["sampling_verdict"] = out.get("sampling_verdict", pd.Series(index=out.index, dtype=object)).fillna("n/a")
    return out.sort_values([*AXES, "cell_id"], kind="stable", ignore_index=True)


def _decide(tested: list, alpha: float) -> None:
    """Each tested cell's verdict, within the family of the run's sampling cells (Benjamini-Hochberg over their
    sampling_p: orchestrator/judge/families.py). A cell the family calls has its tests at alpha x R / m (BH's
    threshold: its sampling_p is below it), one it does not call at the family's level alpha x (R + 1) / m, so
    its power is stated there; each divided by the cell's tests (Bonferroni within the cell)."""
    own = [row["cell_id"] == row["baseline_cell_id"] for row, _, _ in tested]   # the baseline against itself
    fam = family([math.nan if o else row["sampling_p"] for (row, _, _), o in zip(tested, own)], alpha, BH)
    for (row, finish, seed), q, called, o in zip(tested, fam.q, fam.called, own):
        row["sampling_q"] = row["sampling_p"] if o else float(q)
        dist = finish(alpha if o else alpha * fam.n_called / fam.size if called else fam.level)
        row["sampling_verdict"] = "identical" if row["seed_verdict"] == "identical" else row["dist_verdict"]
        row["sampling_reason"] = f"{seed}; distribution: {dist}; repeatable within the cell: " + (
            "n/a (one repeat)" if row["repeatable"] is None else f"{row['repeatable']:.0%}") + \
            ("" if o else f"; {fam.summary()}")


def analyse_sampling(run_dir: str | Path, baseline: dict | None = None, tolerances: Tolerances | None = None) -> pd.DataFrame:
    root = Path(run_dir)
    manifest = RunStore(root).read_manifest()
    selector, tol = run_settings(manifest, baseline, tolerances)
    samples = _samples(root)
    cells = with_baselines(_cells(root), samples.cell_id, selector, "samples")
    return sampling_verdicts(cells, samples, samples, cells, tol, manifest, manifest, _rescored(root))


def compare_sampling_runs(new_dir: str | Path, old_dir: str | Path, pairs: pd.DataFrame,
                          tolerances: Tolerances | None = None) -> pd.DataFrame:
    """NEW's cells against their partners in OLD (cell_id -> baseline_cell_id, as compare_runs pairs them)."""
    new_root, old_root = Path(new_dir), Path(old_dir)
    manifest = RunStore(new_root).read_manifest()
    _, tol = run_settings(manifest, {}, tolerances)
    new = with_old_partners(new_root, old_root, pairs).merge(_cells(new_root)[["cell_id", "versions"]],
                                                              on="cell_id", how="left")
    return sampling_verdicts(new, _samples(new_root), _samples(old_root), _cells(old_root), tol, manifest,
                             RunStore(old_root).read_manifest())
