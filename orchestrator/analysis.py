"""Lossless analysis: every cell against a baseline cell, computed from the stored Parquet alone.

How the CLI is meant to call it (no engine is involved, so it can be re-run with other settings):

    bench compare RUN [--baseline "framework=hf,quantization=fp32"] [--tolerances "atol=1e-4,kl_near=0.02"]
        df = analyse(RUN, baseline=parse_selector(sel) if sel else None,
                     tolerances=parse_tolerances(tol, base=None) if tol else None)
        rich.print(compare_table(df))          # df.to_parquet(...) keeps every column

    bench gate RUN --policy policy.yaml        # exit status 1 when ok is False
        ok, lines = gate(analyse(RUN), load_policy("policy.yaml"))

    policy.yaml:
        rules:
          - match: {framework: vllm, quantization: [fp16, bf16]}   # list: each value must be present
            must_be: lossless                                     # identical | lossless | near-lossless

Without arguments the baseline selector and the tolerances come from manifest.json ("matrix").
parse_tolerances(text, base) overrides fields of `base` (the defaults when None).

Per cell against its baseline (repeat 0 of both, over the positions both captured):
  logits  teacher-forced "prompt" rows: max_abs / mean_abs of the actual token's logprob,
          frac_over_atol, kl_mean / kl_max = KL(baseline || cell) over the baseline's top-k ids
          plus one tail bucket, top1 (share of positions with the same top-1 id)
  text    greedy "generation" rows: greedy_match (share of prompts with the same tokens),
          first_div_min / first_div_mean (0-based step of the first differing token, over the
          prompts that diverge), greedy_close (share that match, or pass vLLM's
          check_logprobs_close: at the first divergence each token is in the other's top-k).
          A missing token (truncated generation) is a divergence there, and never "close".
  task    ppl / ppl_base over the common teacher-forced positions, ppl_rel = ppl / ppl_base - 1
  noise   rr_* = one cell's repeat 0 vs repeat 1; bi_* = the batch-1 (else smallest batch) cell vs
          the largest-batch cell of the same engine_key; noise_* = the baseline engine's floor,
          the worse of its rr and bi
  speed   speedup = output_tok_s / baseline's, with a bootstrap 95% CI (speedup_lo/hi) from the
          per-repeat throughputs; ttft_ratio; mem_saving = 1 - peak_mem / baseline's

Verdicts (worst metric wins; `reason` names the metric and the threshold it crossed):
  identical      all compared logprobs and top-k lists bitwise equal, same greedy tokens, and both
                 sides scored the same positions
  lossless       max_abs <= atol, kl_mean <= kl_lossless, top1 >= top1_lossless,
                 greedy_match >= greedy_match_lossless, |ppl_rel| <= ppl_rel_lossless; a metric
                 within noise_factor x the baseline's noise floor also counts as lossless
  near-lossless  kl_mean <= kl_near, top1 >= top1_near, greedy_close >= greedy_match_near,
                 |ppl_rel| <= ppl_rel_near (max_abs and exact greedy match only gate lossless)
  lossy          otherwise
  n/a            the cell is not ok, has no logprobs, has no usable baseline, or its scoring
                 tokens differ from the baseline's

The per-position joins run in DuckDB over the Parquet files; only per-pair aggregates reach pandas.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import tempfile
from pathlib import Path
from typing import Any, Literal

import duckdb
import numpy as np
import pandas as pd
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from adapters.base import normalize_quantization
from orchestrator.matrix import AXES, Matrix, Tolerances, _pydantic_problems
from orchestrator.store import RunStore

VERDICTS = ("identical", "lossless", "near-lossless", "lossy")
BOOTSTRAP_RESAMPLES = 1000
_CONFIG_AXES = ("framework", "model", "quantization", "flags")
_INT_AXES = ("batch_size", "input_len", "output_len")
_LN_FLOOR = math.log(1e-12)  # probabilities are floored at 1e-12 inside the KL
_DUCKDB_MEMORY = "3GB"       # the whole analysis must stay under 4 GiB


# ------------------------------------------------------------------ selectors and settings

def _axis_value(axis: str, v: Any) -> Any:
    """Comparable form of an axis value (quantization aliases, ints from YAML or the CLI)."""
    if v is None:
        return None
    if axis == "quantization":
        return normalize_quantization(str(v))
    return int(v) if axis in _INT_AXES else str(v)


def parse_selector(text: str) -> dict[str, Any]:
    """'framework=hf,quantization=fp32' -> {'framework': 'hf', 'quantization': 'fp32'}."""
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = (s.strip() for s in part.partition("="))
        if not sep or not value:
            raise ValueError(f"baseline: expected axis=value, got {part!r}")
        if key not in AXES:
            raise ValueError(f"baseline: unknown axis {key!r} (known: {', '.join(AXES)})")
        try:
            out[key] = _axis_value(key, value) if key in _INT_AXES else value
        except ValueError:
            raise ValueError(f"baseline: {key} must be an integer, got {value!r}") from None
    return out


def parse_tolerances(text: str, base: Tolerances | None = None) -> Tolerances:
    """'atol=1e-4,kl_near=0.02' -> `base` (default Tolerances()) with those fields replaced."""
    values = (base or Tolerances()).model_dump()
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = (s.strip() for s in part.partition("="))
        if not sep or key not in values:
            raise ValueError(f"tolerances: expected name=value with name one of {', '.join(values)}; got {part!r}")
        values[key] = value
    try:
        return Tolerances.model_validate(values)
    except ValidationError as err:
        raise ValueError("tolerances: " + "; ".join(_pydantic_problems(err))) from None


def _settings(root: Path, baseline: dict | None, tolerances: Tolerances | None) -> tuple[dict, Tolerances]:
    matrix = RunStore(root).read_manifest().get("matrix") or {}
    if baseline is None:
        baseline = matrix.get("baseline") or Matrix.model_fields["baseline"].default_factory()
    if tolerances is None:
        tolerances = Tolerances.model_validate(matrix.get("tolerances") or {})
    unknown = sorted(set(baseline) - set(AXES))
    if unknown:
        raise ValueError(f"baseline: unknown axis {unknown} (known: {', '.join(AXES)})")
    return baseline, tolerances


# ------------------------------------------------------------------ reading the run

@contextlib.contextmanager
def _duckdb():
    with tempfile.TemporaryDirectory(prefix="bench-analysis-") as tmp:
        con = duckdb.connect(config={"memory_limit": _DUCKDB_MEMORY, "temp_directory": tmp,
                                     "preserve_insertion_order": False})
        try:
            yield con
        finally:
            con.close()


def _read_cells(con, root: Path) -> pd.DataFrame:
    if not any((root / "cells").glob("framework=*/*.parquet")):
        cells = RunStore(root).read_cells()  # empty, with the schema's columns
    else:
        # one DuckDB scan, not a Python loop over (possibly 100k) files; the file has `framework` too
        glob = root / "cells" / "*" / "*.parquet"
        cells = con.sql(f"SELECT * FROM read_parquet('{glob}', hive_partitioning=false, union_by_name=true)").df()
    cells = cells.rename(columns={"reason": "status_reason"}).sort_values("cell_id", ignore_index=True)
    derived = cells[list(_CONFIG_AXES)].astype(str).agg("/".join, axis=1) if len(cells) else None
    cells["engine_key"] = cells["engine_key"].where(cells["engine_key"].notna(), derived)
    return cells


def _lp_source(root: Path) -> str:
    return f"read_parquet('{root / 'logprobs' / '**' / '*.parquet'}', hive_partitioning=true)"


def _position_counts(con, root: Path) -> dict[tuple[str, int, str], int]:
    """(cell_id, repeat, kind) -> scored positions stored."""
    if not any((root / "logprobs").glob("framework=*/*.parquet")):
        return {}
    rows = con.sql(f"SELECT cell_id, repeat, kind, count(*) FROM {_lp_source(root)} GROUP BY ALL").fetchall()
    return {(c, int(r), k): int(n) for c, r, k, n in rows}


# ------------------------------------------------------------------ pair metrics, in SQL

_SIDES = """
a_side AS (SELECT p.pair_id, l.prompt_index, l.position, l.token_id, l.logprob, l.topk_ids, l.topk_logprobs
           FROM pairs p JOIN lp l ON l.cell_id = p.a_cell AND l.repeat = p.a_rep WHERE l.kind = '{kind}'),
b_side AS (SELECT p.pair_id, l.prompt_index, l.position, l.token_id, l.logprob, l.topk_ids, l.topk_logprobs
           FROM pairs p JOIN lp l ON l.cell_id = p.b_cell AND l.repeat = p.b_rep WHERE l.kind = '{kind}')
"""

# KL(a || b) over a's top-k ids plus one tail bucket. Where both top-k id lists are equal (the
# common case) b's logprobs line up with a's and the O(k^2) id lookup is skipped.
_PROMPT_SQL = """
WITH lp AS (SELECT * FROM {src}), {sides},
j AS (
  SELECT a.pair_id, a.token_id <> b.token_id AS tok_mismatch,
         abs(a.logprob::DOUBLE - b.logprob::DOUBLE) AS d, a.logprob::DOUBLE AS la, b.logprob::DOUBLE AS lb,
         a.topk_ids[1] = b.topk_ids[1] AS top1,
         a.logprob = b.logprob AND a.topk_ids = b.topk_ids AND a.topk_logprobs = b.topk_logprobs AS same,
         list_transform(a.topk_logprobs, lambda x: greatest(x::DOUBLE, {ln_floor})) AS lnp,
         CASE WHEN a.topk_ids = b.topk_ids THEN list_transform(b.topk_logprobs, lambda x: x::DOUBLE)
              -- NULL where b's top-k lacks the id: that mass is in b's tail
              ELSE list_transform(a.topk_ids, lambda x: b.topk_logprobs[list_position(b.topk_ids, x)]::DOUBLE)
         END AS lq
  FROM a_side a JOIN b_side b USING (pair_id, prompt_index, position)),
t AS (
  SELECT *, list_transform(lnp, lambda x: exp(x)) AS p,
         list_transform(lq, lambda x: greatest(coalesce(x, {ln_floor}), {ln_floor})) AS lnq,
         greatest(1 - list_sum(list_transform(lnp, lambda x: exp(x))), 0) AS p_tail,
         greatest(1 - coalesce(list_sum(list_transform(lq, lambda x: exp(x))), 0), 0) AS q_tail
  FROM j),
k AS (
  SELECT *, list_dot_product(p, lnp) - list_dot_product(p, lnq)
            + greatest(p_tail, 1e-12) * (ln(greatest(p_tail, 1e-12)) - ln(greatest(q_tail, 1e-12))) AS kl
  FROM t)
SELECT pair_id, count(*) AS n_positions, sum(tok_mismatch::INT) AS token_mismatch,
       max(d) AS max_abs, avg(d) AS mean_abs, avg((d > {atol})::DOUBLE) AS frac_over_atol,
       avg(kl) AS kl_mean, max(kl) AS kl_max, avg(top1::DOUBLE) AS top1, bool_and(same) AS prompt_same,
       exp(-avg(la)) AS ppl_base, exp(-avg(lb)) AS ppl
FROM k GROUP BY pair_id
"""

# generation positions continue the prompt, so step = position - the prompt's first position
_GEN_SQL = """
WITH lp AS (SELECT * FROM {src}), {sides},
g AS (
  SELECT coalesce(a.pair_id, b.pair_id) AS pair_id, coalesce(a.prompt_index, b.prompt_index) AS prompt_index,
         coalesce(a.position, b.position) AS position,
         a.token_id IS DISTINCT FROM b.token_id AS diverged,
         coalesce(list_contains(b.topk_ids, a.token_id) AND list_contains(a.topk_ids, b.token_id), false) AS close,
         coalesce(a.token_id = b.token_id AND a.logprob = b.logprob AND a.topk_ids = b.topk_ids
                  AND a.topk_logprobs = b.topk_logprobs, false) AS same
  FROM a_side a FULL JOIN b_side b
    ON a.pair_id = b.pair_id AND a.prompt_index = b.prompt_index AND a.position = b.position),
per_prompt AS (
  SELECT pair_id, prompt_index, bool_or(diverged) AS diverged, bool_and(same) AS same,
         min(position) FILTER (WHERE diverged) - min(position) AS first_div,
         arg_min(close, position) FILTER (WHERE diverged) AS close_at_div, count(*) AS n_tokens
  FROM g GROUP BY pair_id, prompt_index)
SELECT pair_id, count(*) AS n_gen_prompts, sum(n_tokens) AS n_gen_tokens,
       avg((NOT diverged)::DOUBLE) AS greedy_match, avg((NOT diverged OR close_at_div)::DOUBLE) AS greedy_close,
       min(first_div)::DOUBLE AS first_div_min, avg(first_div) AS first_div_mean, bool_and(same) AS gen_same
FROM per_prompt GROUP BY pair_id
"""

_PAIR_METRICS = ["n_positions", "token_mismatch", "max_abs", "mean_abs", "frac_over_atol", "kl_mean", "kl_max",
                 "top1", "ppl", "ppl_base", "ppl_rel", "n_gen_prompts", "n_gen_tokens", "greedy_match",
                 "greedy_close", "first_div_min", "first_div_mean", "identical"]


def _pair_metrics(con, root: Path, pairs: pd.DataFrame, atol: float, counts: dict) -> pd.DataFrame:
    """`pairs` (pair_id, a_cell, a_rep, b_cell, b_rep) plus the metrics of b against a."""
    if pairs.empty or not counts:
        return pairs.reindex(columns=[*pairs.columns, *_PAIR_METRICS])
    con.register("pairs", pairs[["pair_id", "a_cell", "a_rep", "b_cell", "b_rep"]])
    src = _lp_source(root)
    prompt = con.sql(_PROMPT_SQL.format(src=src, sides=_SIDES.format(kind="prompt"),
                                        ln_floor=repr(_LN_FLOOR), atol=repr(float(atol)))).df()
    gen = con.sql(_GEN_SQL.format(src=src, sides=_SIDES.format(kind="generation"))).df()
    con.unregister("pairs")
    m = pairs.merge(prompt, on="pair_id", how="left").merge(gen, on="pair_id", how="left")
    m["ppl_rel"] = m["ppl"] / m["ppl_base"] - 1
    # identical also needs both sides to have scored the same teacher-forced positions
    n = m["n_positions"].fillna(0).astype(int)
    same_coverage = [counts.get((a, ra, "prompt"), 0) == counts.get((b, rb, "prompt"), 0) == k
                     for a, ra, b, rb, k in zip(m.a_cell, m.a_rep, m.b_cell, m.b_rep, n)]
    m["identical"] = (np.asarray(same_coverage, bool) & m["prompt_same"].fillna(True).astype(bool)
                      & m["gen_same"].fillna(True).astype(bool) & ((n > 0) | (m["n_gen_prompts"].fillna(0) > 0)))
    return m.drop(columns=["prompt_same", "gen_same"])


# ------------------------------------------------------------------ which cells are compared

def _resolve_baselines(cells: pd.DataFrame, comparable: pd.DataFrame, selector: dict) -> tuple[list, list]:
    """For each cell: the baseline cell_id (or None) and how it was chosen."""
    by_config: dict[tuple, list] = {}
    for c in comparable.itertuples(index=False):
        by_config.setdefault(tuple(_axis_value(a, getattr(c, a)) for a in _CONFIG_AXES), []).append(c)
    sel = {k: _axis_value(k, v) for k, v in selector.items()}
    cache: dict[tuple, tuple] = {}
    chosen = []
    for r in cells.itertuples(index=False):
        want = {a: sel[a] if a in sel else _axis_value(a, getattr(r, a)) for a in AXES}
        key = tuple(want.values())
        if key not in cache:
            cache[key] = _pick_baseline(by_config.get(tuple(want[a] for a in _CONFIG_AXES), []), want, sel)
        chosen.append(cache[key])
    return [c[0] for c in chosen], [c[1] for c in chosen]


def _pick_baseline(cands: list, want: dict, sel: dict) -> tuple[str | None, str]:
    # axes the selector names are fixed; batch size and lengths may fall back, since every cell
    # scores the same prompts: exact, else batch 1, else the smallest batch (own lengths first)
    cands = [c for c in cands if all(getattr(c, a) == sel[a] for a in _INT_AXES if a in sel)]
    if not cands:
        named = ", ".join(f"{a}={want[a]}" for a in AXES if a in sel or a in _CONFIG_AXES)
        return None, f"no ok baseline cell with logprobs for {named}"

    def diff(c) -> list[str]:
        return [a for a in _INT_AXES if getattr(c, a) != want[a]]

    best = min(cands, key=lambda c: (bool(diff(c)), "input_len" in diff(c) or "output_len" in diff(c),
                                     c.batch_size != 1, c.batch_size, c.input_len, c.output_len, c.cell_id))
    if not diff(best):
        return best.cell_id, "exact"
    return best.cell_id, ("fallback: baseline " + ", ".join(f"{a}={getattr(best, a)}" for a in diff(best))
                          + " (none at " + ", ".join(f"{a}={want[a]}" for a in diff(best)) + ")")


def _noise_pairs(comparable: pd.DataFrame, has_repeat1: set) -> pd.DataFrame:
    """Per engine_key: run-to-run (its smallest-batch cell, repeat 0 vs 1) and batch invariance."""
    rows = []
    for key, grp in comparable.groupby("engine_key", sort=True):
        grp = grp.assign(_not1=grp.batch_size != 1).sort_values(["_not1", "batch_size", "input_len", "output_len", "cell_id"])
        small = grp.iloc[0]
        big = grp[grp.batch_size == grp.batch_size.max()].iloc[0]
        if small.cell_id in has_repeat1:
            rows.append(("rr", key, small.cell_id, 0, small.cell_id, 1))
        if big.batch_size != small.batch_size:
            rows.append(("bi", key, small.cell_id, 0, big.cell_id, 0))
    return pd.DataFrame(rows, columns=["kind", "key", "a_cell", "a_rep", "b_cell", "b_rep"])


# ------------------------------------------------------------------ verdicts

# (metric, lossless tolerance, near tolerance, larger is worse); None: the metric does not gate
# that level. Near-lossless looks at the greedy "close" rate instead of the exact-match rate.
# ppl_rel is judged by its size: the column abs_ppl_rel, and noise_ppl_rel holds a size too.
_CHECKS = (
    ("max_abs", "atol", None, True),
    ("kl_mean", "kl_lossless", "kl_near", True),
    ("top1", "top1_lossless", "top1_near", False),
    ("greedy_match", "greedy_match_lossless", None, False),
    ("greedy_close", None, "greedy_match_near", False),
    ("ppl_rel", "ppl_rel_lossless", "ppl_rel_near", True),
)
_NOISE = [c[0] for c in _CHECKS] + ["kl_max"]
_COLUMN = {"ppl_rel": "abs_ppl_rel"}


def _fmt(v: float) -> str:
    return f"{v:.3g}" if v == 0 or 1e-2 <= abs(v) < 1e4 else f"{v:.1e}"


def _finite(v) -> bool:
    return v is not None and isinstance(v, (int, float, np.number)) and math.isfinite(v)


def _verdict(r: dict, tol: Tolerances) -> tuple[str, str]:
    if r["status"] != "ok":
        return "n/a", f"status {r['status']}" + (f": {r['status_reason']}" if r.get("status_reason") else "")
    if not r["has_logprobs"]:
        return "n/a", "no logprobs stored for this cell"
    if r["baseline_cell_id"] is None:
        return "n/a", r["baseline_match"]
    if not (_finite(r["n_positions"]) or _finite(r["n_gen_prompts"])):
        return "n/a", "no logprobs in common with the baseline"
    if _finite(r["token_mismatch"]) and r["token_mismatch"] > 0:
        return "n/a", f"{int(r['token_mismatch'])} teacher-forced tokens differ from the baseline's (another tokenizer?)"
    if r["identical"] is True:
        return "identical", f"bitwise identical to {r['baseline_cell_id']}"
    level, why, noise_why = "lossless", {"near-lossless": [], "lossy": []}, []
    for metric, lo, near, up in _CHECKS:
        v, noise = r[_COLUMN.get(metric, metric)], r["noise_" + metric]
        metric = "|ppl_rel|" if metric == "ppl_rel" else metric
        if not _finite(v):
            continue
        bad = (lambda limit: v > limit) if up else (lambda limit: v < limit)
        # distance from exact; a deviation the baseline shows against itself is not the optimisation's
        if _finite(noise) and (v if up else 1 - v) <= tol.noise_factor * (noise if up else 1 - noise):
            if lo and bad(getattr(tol, lo)):
                noise_why.append(f"{metric} {_fmt(v)} within noise {_fmt(noise)}")
            continue
        op = ">" if up else "<"
        if near and bad(getattr(tol, near)):
            level = "lossy"
            why["lossy"].append(f"{metric} {_fmt(v)} {op} {near} {_fmt(getattr(tol, near))}")
        elif lo and bad(getattr(tol, lo)):
            level = "lossy" if level == "lossy" else "near-lossless"
            why["near-lossless"].append(f"{metric} {_fmt(v)} {op} {lo} {_fmt(getattr(tol, lo))}")
    if level != "lossless":
        return level, "; ".join(why[level])
    if noise_why:
        return "lossless", "not bit-identical; within the baseline's noise floor: " + "; ".join(noise_why)
    return "lossless", "not bit-identical; within the lossless tolerances"


# ------------------------------------------------------------------ speed

def _ratio(a, b) -> float:
    return float(a) / float(b) if _finite(a) and _finite(b) and b else math.nan


def _runs(x) -> np.ndarray:
    return np.asarray([] if x is None or isinstance(x, float) else x, dtype=float)


def _bootstrap_ci(num_runs: list, den_runs: list, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """95% percentile CI of mean(num)/mean(den), resampling each side's repeats independently.

    Cells with the same repeat counts share one set of resample indices, so it is vectorised.
    """
    lo, hi = np.full(len(num_runs), np.nan), np.full(len(num_runs), np.nan)
    rng = np.random.default_rng(seed)
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (n, d) in enumerate(zip(num_runs, den_runs)):
        if len(n) and len(d):
            groups.setdefault((len(n), len(d)), []).append(i)
    for (ln_, ld), idx in sorted(groups.items()):
        pick_n = rng.integers(0, ln_, (BOOTSTRAP_RESAMPLES, ln_))
        pick_d = rng.integers(0, ld, (BOOTSTRAP_RESAMPLES, ld))
        for chunk in (idx[i:i + 4096] for i in range(0, len(idx), 4096)):
            n = np.stack([num_runs[i] for i in chunk])[:, pick_n].mean(axis=2)
            d = np.stack([den_runs[i] for i in chunk])[:, pick_d].mean(axis=2)
            lo[chunk], hi[chunk] = np.percentile(n / d, [2.5, 97.5], axis=1)
    return lo, hi


def _add_speed(df: pd.DataFrame, cells: pd.DataFrame) -> None:
    b = cells.set_index("cell_id").reindex(df.baseline_cell_id)
    df["speedup"] = [_ratio(x, y) for x, y in zip(df.output_tok_s, b.output_tok_s)]
    df["ttft_ratio"] = [_ratio(x, y) for x, y in zip(df.ttft_ms_p50, b.ttft_ms_p50)]
    df["mem_saving"] = [1 - _ratio(x, y) for x, y in zip(df.peak_mem_bytes, b.peak_mem_bytes)]
    ok = df.speedup.notna().to_numpy()
    num = [_runs(x) if k else _runs(None) for x, k in zip(df.output_tok_s_runs, ok)]
    df["speedup_lo"], df["speedup_hi"] = _bootstrap_ci(num, [_runs(x) for x in b.output_tok_s_runs])


# ------------------------------------------------------------------ the analysis

def analyse(run_dir: str | Path, baseline: dict | None = None, tolerances: Tolerances | None = None) -> pd.DataFrame:
    """One row per cell: axes, status, verdict, reason, quality metrics, noise floors and speed."""
    root = Path(run_dir)
    baseline, tolerances = _settings(root, baseline, tolerances)
    with _duckdb() as con:
        cells = _read_cells(con, root)
        counts = _position_counts(con, root)
        with_lp = {c for c, r, _ in counts if r == 0}
        cells["has_logprobs"] = cells.cell_id.isin(with_lp)
        comparable = cells[(cells.status == "ok") & cells.has_logprobs]
        cells["baseline_cell_id"], cells["baseline_match"] = _resolve_baselines(cells, comparable, baseline)

        # one pairs table, so all comparisons share two passes over the logprobs
        base = cells[cells.cell_id.isin(comparable.cell_id) & cells.baseline_cell_id.notna()]
        pairs = pd.concat([
            pd.DataFrame({"kind": "base", "key": base.cell_id, "a_cell": base.baseline_cell_id, "a_rep": 0,
                          "b_cell": base.cell_id, "b_rep": 0}),
            _noise_pairs(comparable, {c for c, r, _ in counts if r == 1}),
        ], ignore_index=True).astype({"a_rep": "int16", "b_rep": "int16"})
        pairs["pair_id"] = np.arange(len(pairs), dtype=np.int64)
        pm = _pair_metrics(con, root, pairs, tolerances.atol, counts)
    pm["abs_ppl_rel"] = pm["ppl_rel"].abs()

    df = cells.merge(pm[pm.kind == "base"].drop(columns=["kind", "a_cell", "a_rep", "b_cell", "b_rep", "pair_id"])
                     .rename(columns={"key": "cell_id"}), on="cell_id", how="left")
    # the cell's own engine floor, and the baseline engine's (the worse of run-to-run and batch)
    floors = {kind: pm[pm.kind == kind].set_index("key") for kind in ("rr", "bi")}
    for kind, floor in floors.items():
        own = floor.reindex(df.engine_key)
        for col in ("max_abs", "kl_mean", "identical"):
            df[f"{kind}_{col}"] = own[col].to_numpy()
    base_key = df.baseline_cell_id.map(cells.set_index("cell_id").engine_key)
    for col in _NOISE:
        rr, bi = (floors[k][_COLUMN.get(col, col)].reindex(base_key).to_numpy(dtype=float) for k in ("rr", "bi"))
        df["noise_" + col] = np.fmin(rr, bi) if col in ("top1", "greedy_match", "greedy_close") else np.fmax(rr, bi)
    _add_speed(df, cells)

    records = df.to_dict("records")
    for r in records:  # NaN -> None so "missing" reads the same for every column type
        r.update({k: None for k, v in r.items() if isinstance(v, float) and math.isnan(v)})
    df["verdict"], df["reason"] = zip(*[_verdict(r, tolerances) for r in records]) if records else ([], [])
    return _order(df)


def _order(df: pd.DataFrame) -> pd.DataFrame:
    first = ["cell_id", *AXES, "engine_key", "status", "verdict", "reason", "baseline_cell_id", "baseline_match",
             "max_abs", "mean_abs", "frac_over_atol", "kl_mean", "kl_max", "top1", "greedy_match", "greedy_close",
             "first_div_min", "first_div_mean", "ppl", "ppl_base", "ppl_rel", "identical",
             *[f"noise_{c}" for c in _NOISE], "rr_max_abs", "rr_kl_mean", "rr_identical",
             "bi_max_abs", "bi_kl_mean", "bi_identical", "speedup", "speedup_lo", "speedup_hi", "ttft_ratio",
             "mem_saving", "n_positions", "n_gen_prompts", "n_gen_tokens", "token_mismatch"]
    rest = [c for c in df.columns if c not in first and c != "abs_ppl_rel"]
    return df[first + rest].reset_index(drop=True)


# ------------------------------------------------------------------ table

_STYLE = {"identical": "bold green", "lossless": "green", "near-lossless": "yellow", "lossy": "bold red", "n/a": "dim"}


def compare_table(df: pd.DataFrame) -> "rich.table.Table":  # noqa: F821
    from rich.table import Table

    def num(v, spec=".2g") -> str:
        return "" if not _finite(v) else format(v, spec)

    t = Table(title="Lossless comparison", show_lines=False)
    for col in ("framework", "model", "quant", "flags", "batch", "verdict", "kl_mean", "max_abs", "noise",
                "top1", "greedy", "ppl_rel", "speedup [95% CI]", "mem saved", "reason"):
        t.add_column(col, justify="right" if col not in ("verdict", "reason", "framework", "model", "flags") else "left",
                     overflow="fold")
    for r in df.to_dict("records"):
        speed = "" if not _finite(r["speedup"]) else \
            f"{r['speedup']:.2f}x [{num(r['speedup_lo'], '.2f')}, {num(r['speedup_hi'], '.2f')}]"
        greedy = "" if not _finite(r["greedy_match"]) else f"{r['greedy_match']:.2f}/{r['greedy_close']:.2f}"
        t.add_row(str(r["framework"]), str(r["model"]), str(r["quantization"]), str(r["flags"]), str(r["batch_size"]),
                  f"[{_STYLE[r['verdict']]}]{r['verdict']}[/]", num(r["kl_mean"]), num(r["max_abs"]),
                  num(r["noise_max_abs"]), num(r["top1"], ".3f"), greedy, num(r["ppl_rel"], "+.2g"), speed,
                  num(r["mem_saving"], ".0%"), str(r["reason"]))
    return t


# ------------------------------------------------------------------ policy gate

class PolicyError(ValueError):
    def __init__(self, problems: list[str], source: str = "policy"):
        self.problems = problems
        super().__init__(f"{source}: {len(problems)} problem(s)\n" + "\n".join(f"  {p}" for p in problems))


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid")
    match: dict[str, Any] = Field(default_factory=dict, description="Axis values (a list: any of them, each required)")
    must_be: Literal["identical", "lossless", "near-lossless"]

    @field_validator("match")
    @classmethod
    def _axes_only(cls, v: dict) -> dict:
        unknown = sorted(set(v) - set(AXES))
        if unknown:
            raise ValueError(f"unknown axis {', '.join(map(repr, unknown))} (known: {', '.join(AXES)})")
        return v


class Policy(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rules: list[Rule] = Field(min_length=1)


def load_policy(path: str | Path) -> Policy:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise PolicyError([f"(yaml): {err}"], str(path)) from None
    try:
        return Policy.model_validate(data)
    except ValidationError as err:
        raise PolicyError(_pydantic_problems(err), str(path)) from None


def gate(df: pd.DataFrame, policy: Policy) -> tuple[bool, list[str]]:
    """(True, []) when every cell a rule matches meets it; else one line per failure."""
    lines: list[str] = []
    rank = {v: i for i, v in enumerate(VERDICTS)}
    for i, rule in enumerate(policy.rules):
        wants = {a: [_axis_value(a, x) for x in (v if isinstance(v, list) else [v])] for a, v in rule.match.items()}
        have = {a: [_axis_value(a, x) for x in df[a]] for a in wants}
        hit = np.array([all(have[a][j] in wants[a] for a in wants) for j in range(len(df))], dtype=bool)
        label = f"rule {i} (must_be {rule.must_be})"
        for combo in itertools.product(*wants.values()):  # every value a rule lists must have been run
            if not any(all(have[a][j] == c for a, c in zip(wants, combo)) for j in np.flatnonzero(hit)):
                lines.append(f"{label}: no cell for " + ", ".join(f"{a}={c}" for a, c in zip(wants, combo)))
        for r in df[hit].to_dict("records"):
            if r["verdict"] == "n/a" or rank[r["verdict"]] > rank[rule.must_be]:
                where = "/".join(str(r[a]) for a in _CONFIG_AXES) + f" batch={r['batch_size']}"
                lines.append(f"{label}: {r['cell_id']} {where}: {r['verdict']}: {r['reason']}")
    return not lines, lines
