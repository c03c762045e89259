"""The logit and text layers: each pair of cells compared position by position in DuckDB, and the
verdict each cell gets from those metrics and the baseline's noise floor.

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

The per-position joins run in DuckDB over the Parquet files: the reference rows of a chunk of
pairs are loaded once, then the compared cells' rows stream past them; only per-(pair, prompt)
sums ever leave DuckDB. Chunks follow the compared cells' cell_id order, so over a compacted run
(logprobs sorted by cell_id, orchestrator/store/compaction.py) each reads one cell_id range and all of
them together read the rows about once; a run is usually one chunk. Rows are matched by cell and
file, so a compacted file's older copy of a cell stored again since is never read.
The reference rows of a compacted run come from the row groups that hold them (compaction puts
the likely references first: the baseline config's cells and each engine's batch-1 cell), not
from a scan. benchmarks/analysis_at_scale.py measures it: 100k cells with 20.6M logprob rows
(top-k 20) on 2 idle cores, compacted, in ~30-36 s per command and under 2 GiB peak RSS (about half
of it DuckDB), against ~5 minutes over the per-cell files (~1 ms per file for 200k files).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from orchestrator.matrix.models import Measure, Tolerances
from orchestrator.store.run_store import RunStore
from orchestrator.store.schema import LOGPROBS_SCHEMA
from orchestrator.values import finite

VERDICTS = ("identical", "lossless", "near-lossless", "lossy")


_LN_FLOOR = math.log(1e-12)  # probabilities are floored at 1e-12 inside the KL


# Each chunk of pairs (a = reference, b = compared): the reference rows are loaded into `ref`,
# then b's files stream past it once. Per (pair, kind, prompt) partial sums come out, and are
# combined with ref's own counts, so positions only one side scored still count.
#
# KL(a || b) = sum_i p_i (ln p_i - ln q_i) + tail term, over a's top-k ids plus one tail bucket,
# with probabilities floored at 1e-12. An id of a's missing from b's top-k gets q_i = min(b's k-th
# probability, b's tail mass / the number of a's ids missing): the truth lies in (0, b's k-th prob]
# and all of them together in b's tail (docs/verdicts.md, "The logit and text layers"). What depends on a alone (p, sum p ln p, a's tail) is
# computed once in `ref`, not once per pair.
_REF_SQL = """
CREATE OR REPLACE TEMP TABLE ref AS
WITH r AS (
  SELECT cell_id, repeat, kind, prompt_index, position, token_id, logprob, topk_ids, topk_logprobs,
         CASE WHEN kind = 'prompt' THEN list_transform(topk_logprobs, lambda x: greatest(x::DOUBLE, {ln_floor})) END AS lnp
  FROM {source}
  WHERE (cell_id, repeat, filename) IN (SELECT DISTINCT a_cell, a_rep, a_file FROM chunk))
SELECT * EXCLUDE (lnp), list_transform(lnp, lambda x: exp(x)) AS p,
       list_sum(list_transform(lnp, lambda x: exp(x) * x)) AS plnp,
       greatest(1 - list_sum(list_transform(lnp, lambda x: exp(x))), 0) AS p_tail
FROM r
"""


# Where both top-k id lists are equal (the common case) b's logprobs line up with a's: one dot
# product. Otherwise each of a's ids is looked up in b's list (missing: in b's tail).
_STREAM_SQL = """
CREATE OR REPLACE TEMP TABLE part AS
WITH b AS (
  SELECT p.pair_id, p.a_cell, p.a_rep, l.kind, l.prompt_index, l.position, l.token_id, l.logprob,
         l.topk_ids, l.topk_logprobs
  FROM {source} l
  JOIN chunk p ON l.cell_id = p.b_cell AND l.repeat = p.b_rep AND l.filename = p.b_file),
j AS (
  SELECT b.pair_id, b.kind, b.prompt_index, b.position, a.token_id IS NOT NULL AS matched,
         a.token_id IS DISTINCT FROM b.token_id AS diverged,
         coalesce(a.token_id = b.token_id AND a.logprob = b.logprob AND a.topk_ids = b.topk_ids
                  AND a.topk_logprobs = b.topk_logprobs, false) AS same,
         CASE WHEN b.kind = 'generation' THEN coalesce(list_contains(b.topk_ids, a.token_id)
                                                       AND list_contains(a.topk_ids, b.token_id), false) END AS close,
         CASE WHEN b.kind = 'prompt' THEN a.token_id <> b.token_id END AS tok_mismatch,
         CASE WHEN b.kind = 'prompt' THEN abs(a.logprob::DOUBLE - b.logprob::DOUBLE) END AS d,
         CASE WHEN b.kind = 'prompt' THEN a.logprob::DOUBLE END AS la,
         CASE WHEN b.kind = 'prompt' AND a.token_id IS NOT NULL THEN b.logprob::DOUBLE END AS lb,
         CASE WHEN b.kind = 'prompt' THEN a.topk_ids[1] = b.topk_ids[1] END AS top1,
         CASE WHEN b.kind = 'prompt' AND a.token_id IS NOT NULL
              THEN a.topk_ids = b.topk_ids AND list_min(b.topk_logprobs) >= {ln_floor} END AS aligned,
         a.p, a.plnp, a.p_tail, a.topk_ids AS a_ids, b.topk_ids AS b_ids, b.topk_logprobs AS b_lps
  FROM b LEFT JOIN ref a ON a.cell_id = b.a_cell AND a.repeat = b.a_rep AND a.kind = b.kind
                         AND a.prompt_index = b.prompt_index AND a.position = b.position),
t0 AS (
  SELECT *,
         CASE WHEN aligned THEN plnp - list_dot_product(p, b_lps::DOUBLE[]) END AS kl_top_aligned,
         CASE WHEN aligned THEN list_sum(list_transform(b_lps, lambda x: exp(x::DOUBLE))) END AS q_sum_aligned,
         CASE WHEN NOT aligned THEN list_transform(a_ids, lambda x: b_lps[list_position(b_ids, x)]::DOUBLE) END AS lq0,
         CASE WHEN NOT aligned THEN greatest(1 - list_sum(list_transform(b_lps, lambda x: exp(x::DOUBLE))), 0) END AS q_tail,
         CASE WHEN NOT aligned THEN exp(list_min(b_lps)::DOUBLE) END AS q_kth
  FROM j),
t2 AS (  -- a's ids missing from b's top-k share b's tail: each min(b's k-th prob, tail / n missing)
  SELECT * EXCLUDE (lq0), CASE WHEN NOT aligned THEN list_transform(lq0, lambda x: coalesce(x, ln(greatest(least(
           q_kth, q_tail / greatest(list_count(a_ids) - list_count(list_filter(lq0, lambda y: y IS NOT NULL)), 1)),
           1e-12)))) END AS lq
  FROM t0),
k AS (  -- exactly 0 where the rows are bitwise equal; elsewhere a negative KL is rounding, clipped
  SELECT *, CASE WHEN same AND kind = 'prompt' THEN 0.0
                 WHEN aligned IS NOT NULL THEN greatest(0, coalesce(kl_top_aligned,
                plnp - list_sum(list_transform(list_zip(p, lq),
                                               lambda z: z[1] * greatest(coalesce(z[2], {ln_floor}), {ln_floor}))))
            + greatest(p_tail, 1e-12) * (ln(greatest(p_tail, 1e-12)) - ln(greatest(1 - coalesce(
                q_sum_aligned, list_sum(list_transform(lq, lambda x: exp(x))), 0), 1e-12)))) END AS kl
  FROM t2)
SELECT pair_id, kind, prompt_index, count(*) AS n_b, count(*) FILTER (WHERE matched) AS n_common,
       min(position) AS b_first, bool_and(same) AS same,
       sum(tok_mismatch::INT) AS tok_mismatch, max(d) AS max_d, sum(d) AS sum_d,
       sum((d > {atol})::INT) AS n_over, sum(kl) AS sum_kl, max(kl) AS max_kl, sum(top1::INT) AS n_top1,
       sum(la) AS sum_la, sum(lb) AS sum_lb,
       min(position) FILTER (WHERE diverged) AS first_mismatch,
       arg_min(close, position) FILTER (WHERE diverged) AS close_at_mismatch
FROM k GROUP BY pair_id, kind, prompt_index
"""


# Positions are contiguous per (cell, kind, prompt) (the worker writes start..start+n), so a b
# shorter than a first lacks position a_first + n_b: a truncation diverges there.
_COMBINE_SQL = """
WITH rs AS (SELECT cell_id, repeat, kind, prompt_index, count(*) AS n_a, min(position) AS a_first
            FROM ref GROUP BY ALL),
s AS (SELECT p.pair_id, rs.kind, rs.prompt_index, rs.n_a, rs.a_first
      FROM chunk p JOIN rs ON rs.cell_id = p.a_cell AND rs.repeat = p.a_rep),
x AS (
  SELECT coalesce(s.pair_id, g.pair_id) AS pair_id, coalesce(s.kind, g.kind) AS kind,
         coalesce(s.n_a, 0) AS n_a, coalesce(g.n_b, 0) AS n_b, coalesce(g.n_common, 0) AS n_common,
         coalesce(g.same, false) AS same, least(s.a_first, g.b_first) AS first_pos, g.* EXCLUDE
         (pair_id, kind, prompt_index, n_b, n_common, same),
         least(g.first_mismatch, CASE WHEN coalesce(g.n_common, 0) < s.n_a
                                      THEN s.a_first + coalesce(g.n_b, 0) END) AS div_pos
  FROM s FULL JOIN part g ON s.pair_id = g.pair_id AND s.kind = g.kind AND s.prompt_index = g.prompt_index),
y AS (
  SELECT *, same AND n_common = n_a AND n_common = n_b AS whole,
         div_pos - first_pos AS first_div,
         div_pos IS NULL OR coalesce(div_pos = first_mismatch AND close_at_mismatch, false) AS ok_close
  FROM x)
SELECT pair_id,
       sum(n_common) FILTER (WHERE kind = 'prompt') AS n_positions,
       sum(tok_mismatch) FILTER (WHERE kind = 'prompt') AS token_mismatch,
       max(max_d) FILTER (WHERE kind = 'prompt') AS max_abs,
       sum(sum_d) FILTER (WHERE kind = 'prompt') / nullif(sum(n_common) FILTER (WHERE kind = 'prompt'), 0) AS mean_abs,
       sum(n_over) FILTER (WHERE kind = 'prompt') / nullif(sum(n_common) FILTER (WHERE kind = 'prompt'), 0) AS frac_over_atol,
       sum(sum_kl) FILTER (WHERE kind = 'prompt') / nullif(sum(n_common) FILTER (WHERE kind = 'prompt'), 0) AS kl_mean,
       max(max_kl) FILTER (WHERE kind = 'prompt') AS kl_max,
       sum(n_top1) FILTER (WHERE kind = 'prompt') / nullif(sum(n_common) FILTER (WHERE kind = 'prompt'), 0) AS top1,
       exp(-sum(sum_lb) FILTER (WHERE kind = 'prompt') / nullif(sum(n_common) FILTER (WHERE kind = 'prompt'), 0)) AS ppl,
       exp(-sum(sum_la) FILTER (WHERE kind = 'prompt') / nullif(sum(n_common) FILTER (WHERE kind = 'prompt'), 0)) AS ppl_base,
       bool_and(whole) FILTER (WHERE kind = 'prompt') AS prompt_same,
       count(*) FILTER (WHERE kind = 'generation') AS n_gen_prompts,
       sum(n_b) FILTER (WHERE kind = 'generation') AS n_gen_tokens,
       avg((div_pos IS NULL)::DOUBLE) FILTER (WHERE kind = 'generation') AS greedy_match,
       avg(ok_close::DOUBLE) FILTER (WHERE kind = 'generation') AS greedy_close,
       CAST(min(first_div) FILTER (WHERE kind = 'generation') AS DOUBLE) AS first_div_min,
       avg(first_div) FILTER (WHERE kind = 'generation') AS first_div_mean,
       bool_and(whole) FILTER (WHERE kind = 'generation') AS gen_same
FROM y GROUP BY pair_id HAVING sum(n_b) > 0
"""


_PAIR_METRICS = ["n_positions", "token_mismatch", "max_abs", "mean_abs", "frac_over_atol", "kl_mean", "kl_max",
                 "top1", "ppl", "ppl_base", "ppl_rel", "n_gen_prompts", "n_gen_tokens", "greedy_match",
                 "greedy_close", "first_div_min", "first_div_mean", "identical"]


_REF_ROWS_PER_CHUNK = 1_500_000  # bounds the reference rows held in memory (~0.6 GiB in DuckDB)


_FILES_PER_CHUNK = 20000         # bounds the file list of one query (a run not compacted: a file per cell)


def _chunks(pairs: pd.DataFrame, ref_rows: float):
    """Pairs sorted by compared cell, cut where the reference rows (estimated: ref_rows per
    reference cell) or the files of one query would pass their bounds. A compacted run holds
    its logprobs sorted by cell_id, so each chunk's b cells are one cell_id range: the scan
    skips the row groups outside it, and all chunks together read the b rows about once."""
    pairs = pairs.sort_values(["b_cell", "a_cell"])
    start, refs, names = 0, set(), set()
    max_refs = max(1, int(_REF_ROWS_PER_CHUNK // max(ref_rows, 1)))
    for i, (a, fa, fb) in enumerate(zip(pairs.a_cell, pairs.a_file, pairs.b_file)):
        grow = (a not in refs) + (fa not in names) + (fb not in names and fb != fa)
        if grow and i > start and (len(refs) + (a not in refs) > max_refs
                                   or len(names) + (fa not in names) + (fb not in names) > _FILES_PER_CHUNK):
            yield pairs.iloc[start:i]
            start, refs, names = i, set(), set()
        refs.add(a)
        names.update((fa, fb))
    if start < len(pairs):
        yield pairs.iloc[start:]


def reference_rows(measure: Measure) -> float:
    """Logprob rows of one repeat of a cell, as the matrix's measure section sizes it."""
    return measure.scoring_prompts * (measure.scoring_len - 1 + measure.greedy_tokens)


def _ref_rows_from_row_groups(chunk: pd.DataFrame, located: dict) -> pa.Table | None:
    """The reference rows of a chunk read from just the row groups that hold them, when every
    reference cell lies in a compacted file (which puts the likely references first); else None."""
    by_file: dict[str, set[str]] = {}
    for cid, f in zip(chunk.a_cell, chunk.a_file):
        if cid not in located:
            return None
        by_file.setdefault(f, set()).add(cid)
    tables = []
    for f, cids in sorted(by_file.items()):
        pf = pq.ParquetFile(f)
        ends = np.cumsum([pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups)])
        groups = set()
        for cid in cids:
            _, start, n = located[cid]
            groups.update(range(int(np.searchsorted(ends, start, "right")), int(np.searchsorted(ends, start + n - 1, "right")) + 1))
        t = pf.read_row_groups(sorted(groups), columns=[c for c in LOGPROBS_SCHEMA.names if c != "run_id"])
        t = t.filter(pc.is_in(t["cell_id"], value_set=pa.array(sorted(cids), pa.string())))
        tables.append(t.append_column("filename", pa.array([f] * t.num_rows, pa.string())))
    return pa.concat_tables(tables) if tables else None


def journal_layouts(*roots: Path) -> dict[str, Any]:
    """journal file -> the Layout that reads it, for the runs at `roots` (see _logprob_source)."""
    out = {}
    for root in roots:
        lay = RunStore(root).layout()
        out.update(dict.fromkeys(map(str, lay.journal_files), lay))
    return out


def _logprob_source(con, name: str, cells: pd.Series, files: pd.Series, journals: dict) -> tuple[str, dict]:
    """A DuckDB relation (SQL text, parameters) over the logprob rows in `files`, each row with its
    file name: Parquet files through read_parquet, journal files (orchestrator/store/journal.py) as an
    Arrow table of just the rows of `cells` (registered as `name`)."""
    parquet = sorted({f for f in files if f not in journals})
    tables = []
    for f, group in cells.groupby(files.to_numpy()):
        if f in journals:
            t = journals[f].journal_rows("logprobs", f, sorted(set(group)))
            tables.append(t.append_column("filename", pa.array([f] * t.num_rows, pa.string())))
    scan = "read_parquet($files, hive_partitioning=false, filename=true)"
    if not tables:
        return scan, {"files": parquet}
    con.register(name, pa.concat_tables(tables))
    if not parquet:
        return name, {}
    return f"(SELECT * FROM {scan} UNION ALL BY NAME SELECT * FROM {name})", {"files": parquet}


def _unregister(con, name: str) -> None:
    try:
        con.unregister(name)
    except Exception:   # nothing registered under it
        pass


def pair_metrics(con, pairs: pd.DataFrame, files: dict[str, str], atol: float, ref_rows: float = 1000.0,
                  located: dict | None = None, journals: dict | None = None,
                  per_prompt: list | None = None) -> pd.DataFrame:
    """`pairs` (pair_id, a_cell, a_rep, b_cell, b_rep, ...) plus the metrics of b against a. Each side's
    file is `files[cell]`, unless the pairs name it (a_file, b_file: two runs hold the same cell ids);
    the reference cells of one call must be distinct by id (they come from one run). `journals`
    (journal_layouts) reads the cells whose file is a journal. `per_prompt`, where given, gets each chunk's
    scoring prompts (pair_id, prompt_index, n_common, sum_kl): what kl_mean sums, by prompt."""
    out = []
    journals = journals or {}
    if "a_file" not in pairs:
        pairs = pairs.assign(a_file=pairs.a_cell.map(files), b_file=pairs.b_cell.map(files))
    for chunk in _chunks(pairs, ref_rows):
        con.register("chunk", chunk[["pair_id", "a_cell", "a_rep", "a_file", "b_cell", "b_rep", "b_file"]])
        refs = _ref_rows_from_row_groups(chunk, located) if located else None
        if refs is not None:
            con.register("ref_src", refs)
            source, params = "ref_src", {}
        else:
            source, params = _logprob_source(con, "ref_src", chunk.a_cell, chunk.a_file, journals)
        con.execute(_REF_SQL.format(ln_floor=repr(_LN_FLOOR), source=source), params)
        _unregister(con, "ref_src")
        source, params = _logprob_source(con, "b_src", chunk.b_cell, chunk.b_file, journals)
        con.execute(_STREAM_SQL.format(ln_floor=repr(_LN_FLOOR), atol=repr(float(atol)), source=source), params)
        _unregister(con, "b_src")
        if per_prompt is not None:
            per_prompt.append(con.sql("SELECT pair_id, prompt_index, n_common, sum_kl FROM part "
                                      "WHERE kind = 'prompt' ORDER BY pair_id, prompt_index").df())
        out.append(con.sql(_COMBINE_SQL).df())
        con.unregister("chunk")
    metrics = pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=["pair_id"])
    m = pairs.merge(metrics, on="pair_id", how="left")
    m = m.reindex(columns=[*m.columns, *(c for c in (*_PAIR_METRICS, "prompt_same", "gen_same") if c not in m)])
    m["ppl_rel"] = m["ppl"] / m["ppl_base"] - 1
    compared = (m["n_positions"].fillna(0) > 0) | (m["n_gen_prompts"].fillna(0) > 0)
    m["identical"] = (m["prompt_same"].fillna(True).astype(bool) & m["gen_same"].fillna(True).astype(bool)
                      & compared)
    return m.drop(columns=["prompt_same", "gen_same"])


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


NOISE_METRICS = [c[0] for c in _CHECKS] + ["kl_max"]


_COLUMN = {"ppl_rel": "abs_ppl_rel"}


def _fmt(v: float) -> str:
    return f"{v:.3g}" if v == 0 or 1e-2 <= abs(v) < 1e4 else f"{v:.1e}"


def _verdict(r: dict, tol: Tolerances) -> tuple[str, str]:
    if r["status"] != "ok":  # the stored reason may end with pages of engine output: its first line
        why = (r.get("reason") or "").strip().splitlines()
        return "n/a", f"status {r['status']}" + (f": {why[0][:200]}" if why else "")
    if not r["has_logprobs"]:
        return "n/a", "no logprobs stored for this cell"
    if r["baseline_cell_id"] is None:
        return "n/a", r["baseline_match"]
    if not (finite(r["n_positions"]) or finite(r["n_gen_prompts"])):
        return "n/a", "no logprobs in common with the baseline"
    if finite(r["token_mismatch"]) and r["token_mismatch"] > 0:
        return "n/a", f"{int(r['token_mismatch'])} teacher-forced tokens differ from the baseline's (another tokenizer?)"
    if r["identical"]:
        return "identical", f"bitwise identical to {r['baseline_cell_id']}"
    level, why, noise_why = "lossless", {"near-lossless": [], "lossy": []}, []
    for metric, lo, near, up in _CHECKS:
        v, noise = r[_COLUMN.get(metric, metric)], r["noise_" + metric]
        metric = "|ppl_rel|" if metric == "ppl_rel" else metric
        if not finite(v):
            continue
        bad = (lambda limit: v > limit) if up else (lambda limit: v < limit)
        # distance from exact; a deviation the baseline shows against itself is not the optimisation's
        if finite(noise) and (v if up else 1 - v) <= tol.noise_factor * (noise if up else 1 - noise):
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
    only = "" if finite(r["n_positions"]) and r["n_positions"] > 0 else \
        " (text layer only: no teacher-forced logprobs to compare)"
    if level != "lossless":
        return level, "; ".join(why[level]) + only
    if noise_why:
        return "lossless", "not bit-identical; within the baseline's noise floor: " + "; ".join(noise_why) + only
    return "lossless", "not bit-identical; within the lossless tolerances" + only


def judge(df: pd.DataFrame, pm: pd.DataFrame, base_key: pd.Series, tolerances: Tolerances,
          own_floors: bool) -> None:
    """Add the noise floors and the verdict to `df` (cells merged with their "base" pair metrics).
    `pm` holds the "rr" and "bi" pairs keyed by engine_key; `base_key` is each cell's baseline engine:
    its floor (the worse of run-to-run and batch) is the cell's noise_*. With own_floors, the cell's
    own engine's rr_/bi_ metrics are added too (within one run: they share its pm)."""
    floors = {kind: pm[pm.kind == kind].set_index("key") for kind in ("rr", "bi")}
    if own_floors:
        for kind, floor in floors.items():
            own = floor.reindex(df.engine_key)
            for col in ("max_abs", "kl_mean", "identical"):
                df[f"{kind}_{col}"] = own[col].to_numpy()
    for col in NOISE_METRICS:
        rr, bi = (floors[k][_COLUMN.get(col, col)].reindex(base_key).to_numpy(dtype=float) for k in ("rr", "bi"))
        df["noise_" + col] = np.fmin(rr, bi) if col in ("top1", "greedy_match", "greedy_close") else np.fmax(rr, bi)
    needed = ["status", "reason", "has_logprobs", "baseline_cell_id", "baseline_match", "n_positions",
              "n_gen_prompts", "token_mismatch", "identical", *(_COLUMN.get(c, c) for c in NOISE_METRICS),
              *(f"noise_{c}" for c in NOISE_METRICS)]
    records = df[needed].to_dict("records")
    for r in records:  # NaN -> None so "missing" reads the same for every column type
        r.update({k: None for k, v in r.items() if isinstance(v, float) and math.isnan(v)})
    df["verdict"], df["verdict_reason"] = zip(*[_verdict(r, tolerances) for r in records]) if records else ([], [])
    if "engine_deviation" in df and len(df):
        _name_engine_deviation(df)


def _name_engine_deviation(df: pd.DataFrame) -> None:
    """A near-lossless or lossy cell whose engine declares a by-design difference (LoadFacts.engine_deviation) that
    its baseline, a cell of this frame, does not share: the reason says so after the metrics."""
    own = df["engine_deviation"].where(df["engine_deviation"].notna(), None)
    base = df["baseline_cell_id"].map(dict(zip(df["cell_id"], own)))
    known = df["baseline_cell_id"].isin(df["cell_id"])
    named = df["verdict"].isin(["near-lossless", "lossy"]) & own.notna() & known & (base != own)
    df.loc[named, "verdict_reason"] = df.loc[named, "verdict_reason"] + "; " + own[named]
