"""Lossless analysis: every cell against a baseline cell, computed from the stored Parquet alone.

How the CLI calls it (no engine is involved, so it can be re-run with other settings):

    bench compare RUN [--baseline "framework=hf,quantization=fp32"] [--tolerances "atol=1e-4,kl_near=0.02"]
        df = analyse(RUN, baseline=parse_selector(sel) if sel else None,
                     tolerances=parse_tolerances(tol, base=None) if tol else None)
        rich.print(compare_table(df))          # orchestrator/console.py; df.to_parquet(...) keeps every column

`bench gate` checks these verdicts against a policy file: orchestrator/gate.py.

Baseline: the selector's axes are fixed, the others are the cell's own. Without such a cell at the
cell's batch size and lengths, the baseline config's batch-1 cell is used, else its smallest batch
(of the cell's own workload first);
`baseline_match` says "exact" or which fallback. The baseline cell is compared with itself.
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
  speed   speedup = output_tok_s / baseline's, with a 95% CI (speedup_lo/hi): the Welch t interval
          on the log ratio of the per-repeat throughputs (adapters/intervals.py; the bootstrap
          under-covers at 3 repeats), over speedup_n_cell / speedup_n_base repeats (0: none);
          speed_call = faster / slower where the interval excludes 1, "no difference" where it
          holds 1 (a difference inside the noise is none), null without an interval; ttft_ratio;
          mem_saving = 1 - peak_mem / baseline's

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
(logprobs sorted by cell_id, orchestrator/compaction.py) each reads one cell_id range and all of
them together read the rows about once; a run is usually one chunk. Rows are matched by cell and
file, so a compacted file's older copy of a cell stored again since is never read.
The reference rows of a compacted run come from the row groups that hold them (compaction puts
the likely references first: the baseline config's cells and each engine's batch-1 cell), not
from a scan. benchmarks/analysis_at_scale.py measures it: 100k cells with 20.6M logprob rows
(top-k 20) on 2 idle cores, compacted, in ~30-36 s per command and under 2 GiB peak RSS (about half
of it DuckDB), against ~5 minutes over the per-cell files (~1 ms per file for 200k files).
"""

from __future__ import annotations

import contextlib
import functools
import math
import tempfile
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import ValidationError

from adapters.base import normalize_quantization
from adapters.intervals import log_ratio_intervals
from orchestrator.matrix import AXES, Matrix, Tolerances, _pydantic_problems
from orchestrator.store import CELLS_SCHEMA, LOGPROBS_SCHEMA, RunStore

VERDICTS = ("identical", "lossless", "near-lossless", "lossy")
_CONFIG_AXES = ("framework", "model", "quantization", "flags", "mode")
_INT_AXES = ("batch_size", "input_len", "output_len")
# where no baseline cell matches, these may fall back (every workload scores the same prompts; the
# fallback is named in baseline_match, since its speed is another workload's)
_LOAD_AXES = (*_INT_AXES, "request_rate", "workload")
_LN_FLOOR = math.log(1e-12)  # probabilities are floored at 1e-12 inside the KL
_DUCKDB_MEMORY = "3GB"       # the whole analysis must stay under 4 GiB


# ------------------------------------------------------------------ selectors and settings

@functools.lru_cache(maxsize=1 << 16, typed=True)   # called per cell and axis (1.6M calls at 100k cells)
def _axis_value(axis: str, v: Any) -> Any:
    """Comparable form of an axis value (quantization aliases, ints from YAML or the CLI)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):   # pandas reads a null as NaN
        return None
    if axis == "quantization":
        return normalize_quantization(str(v))
    if axis == "request_rate":
        return float(v)
    return int(v) if axis in _INT_AXES else str(v)


def parse_selector(text: str, what: str = "baseline") -> dict[str, Any]:
    """'framework=hf,quantization=fp32' -> {'framework': 'hf', 'quantization': 'fp32'}."""
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = (s.strip() for s in part.partition("="))
        if not sep or not value:
            raise ValueError(f"{what}: expected axis=value, got {part!r}")
        if key not in AXES:
            raise ValueError(f"{what}: unknown axis {key!r} (known: {', '.join(AXES)})")
        try:
            out[key] = _axis_value(key, value) if key in _LOAD_AXES else value
        except ValueError:
            kind = "a number" if key == "request_rate" else "an integer"
            raise ValueError(f"{what}: {key} must be {kind}, got {value!r}") from None
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

# The cells columns the analysis returns; per-request lists and JSON blobs stay in the store.
_CELL_COLUMNS = [c for c in CELLS_SCHEMA.names if c not in (
    "flags_json", "workload_json", "ttft_ms", "tpot_ms", "e2e_ms", "engine_ttft_ms", "versions", "engine_args")]


@contextlib.contextmanager
def _duckdb():
    with tempfile.TemporaryDirectory(prefix="bench-analysis-") as tmp:
        con = duckdb.connect(config={"memory_limit": _DUCKDB_MEMORY, "temp_directory": tmp,
                                     "preserve_insertion_order": False})
        # the hand-written join order is the cheap one; estimates over many small files are not
        con.execute("SET disabled_optimizers = 'join_order'")
        con.execute("SET enable_progress_bar = false")   # it would draw on the terminal of bench compare
        try:
            yield con
        finally:
            con.close()


def _read_cells(con, root: Path) -> pd.DataFrame:
    # the store picks each cell's newest copy, per-cell or compacted (a few files once compacted)
    cells = con.from_arrow(RunStore(root).read_cells_table(_CELL_COLUMNS)).df()   # DuckDB's pandas types
    for col in cells.columns[cells.dtypes == "str"]:  # Python strings: the per-cell loops below iterate them
        cells[col] = cells[col].astype(object).where(cells[col].notna(), None)
    # an SLO search's probes are load points without outputs: its own row carries them (orchestrator/searches.py)
    cells = cells[cells["search_probe"].isna()]
    cells = cells.rename(columns={"reason": "status_reason"}).sort_values("cell_id", ignore_index=True)
    # rows from before serving mode (and hand-made ones) are offline cells
    cells["mode"] = cells["mode"].fillna("offline")
    cells["load"] = cells["load"].fillna("batch")
    missing = cells["engine_key"].isna()
    if missing.any():  # only where none was stored (a row-wise join is slow at 100k cells)
        cells.loc[missing, "engine_key"] = cells.loc[missing, list(_CONFIG_AXES)].astype(str).fillna("None") \
            .agg("/".join, axis=1)
    return cells


def _logprob_files(root: Path, cells: pd.DataFrame) -> dict[str, str]:
    """cell_id -> the file with its logprobs (its own, or a compacted one shared with other cells:
    rows are then selected by cell_id and file, since a compacted file may also hold an older copy
    of a cell stored again since). Only cells that captured rows have one."""
    files = RunStore(root).logprob_files()
    return {cid: str(files[cid]) for cid in cells.cell_id if cid in files}


# ------------------------------------------------------------------ pair metrics, in SQL

# Each chunk of pairs (a = reference, b = compared): the reference rows are loaded into `ref`,
# then b's files stream past it once. Per (pair, kind, prompt) partial sums come out, and are
# combined with ref's own counts, so positions only one side scored still count.
#
# KL(a || b) = sum_i p_i (ln p_i - ln q_i) + tail term, over a's top-k ids plus one tail bucket,
# with probabilities floored at 1e-12. What depends on a alone (p, sum p ln p, a's tail) is
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
t AS (
  SELECT *,
         CASE WHEN aligned THEN plnp - list_dot_product(p, b_lps::DOUBLE[]) END AS kl_top_aligned,
         CASE WHEN aligned THEN list_sum(list_transform(b_lps, lambda x: exp(x::DOUBLE))) END AS q_sum_aligned,
         CASE WHEN NOT aligned THEN list_transform(a_ids, lambda x: b_lps[list_position(b_ids, x)]::DOUBLE) END AS lq
  FROM j),
k AS (  -- exactly 0 where the rows are bitwise equal; elsewhere a negative KL is rounding, clipped
  SELECT *, CASE WHEN same AND kind = 'prompt' THEN 0.0
                 WHEN aligned IS NOT NULL THEN greatest(0, coalesce(kl_top_aligned,
                plnp - list_sum(list_transform(list_zip(p, lq),
                                               lambda z: z[1] * greatest(coalesce(z[2], {ln_floor}), {ln_floor}))))
            + greatest(p_tail, 1e-12) * (ln(greatest(p_tail, 1e-12)) - ln(greatest(1 - coalesce(
                q_sum_aligned, list_sum(list_transform(lq, lambda x: exp(x))), 0), 1e-12)))) END AS kl
  FROM t)
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


def _ref_rows(root: Path) -> float:
    """Logprob rows of one repeat of a cell, as the matrix's measure section sizes it (else 1000)."""
    from orchestrator.matrix import Measure

    try:
        m = Measure.model_validate((RunStore(root).read_manifest().get("matrix") or {}).get("measure") or {})
        return m.scoring_prompts * (m.scoring_len - 1 + m.greedy_tokens)
    except Exception:
        return 1000.0


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
    file name: Parquet files through read_parquet, journal files (orchestrator/journal.py) as an
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


def _pair_metrics(con, pairs: pd.DataFrame, files: dict[str, str], atol: float, ref_rows: float = 1000.0,
                  located: dict | None = None, journals: dict | None = None) -> pd.DataFrame:
    """`pairs` (pair_id, a_cell, a_rep, b_cell, b_rep, ...) plus the metrics of b against a. Each side's
    file is `files[cell]`, unless the pairs name it (a_file, b_file: two runs hold the same cell ids);
    the reference cells of one call must be distinct by id (they come from one run). `journals`
    (journal_layouts) reads the cells whose file is a journal."""
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


# ------------------------------------------------------------------ which cells are compared

def _resolve_baselines(cells: pd.DataFrame, comparable: pd.DataFrame, selector: dict) -> tuple[list, list]:
    """For each cell: the baseline cell_id (or None) and how it was chosen."""
    by_config: dict[tuple, list] = {}
    for c in comparable[[*AXES, "cell_id"]].itertuples(index=False):   # the columns it reads: fast at 100k
        by_config.setdefault(tuple(_axis_value(a, getattr(c, a)) for a in _CONFIG_AXES), []).append(c)
    sel = {k: _axis_value(k, v) for k, v in selector.items()}
    cache: dict[tuple, tuple] = {}
    chosen = []
    for r in cells[list(AXES)].itertuples(index=False):
        want = {a: sel[a] if a in sel else _axis_value(a, getattr(r, a)) for a in AXES}
        if want["mode"] != "serve":
            want["request_rate"] = None   # a served cell's offline baseline has no arrival rate
        key = tuple(want.values())
        if key not in cache:
            cache[key] = _pick_baseline(by_config.get(tuple(want[a] for a in _CONFIG_AXES), []), want, sel)
        chosen.append(cache[key])
    return [c[0] for c in chosen], [c[1] for c in chosen]


def _pick_baseline(cands: list, want: dict, sel: dict) -> tuple[str | None, str]:
    # axes the selector names are fixed; batch size and lengths may fall back, since every cell
    # scores the same prompts: exact, else batch 1, else the smallest batch (own lengths first)
    cands = [c for c in cands if all(_axis_value(a, getattr(c, a)) == sel[a] for a in _LOAD_AXES if a in sel)]
    if not cands:
        shown = [a for a in AXES if a in sel or (a in _CONFIG_AXES and want[a] not in (None, "offline"))]
        named = ", ".join(f"{a}={want[a]}" for a in shown)
        return None, f"no ok baseline cell with logprobs for {named}"

    def diff(c) -> list[str]:
        return [a for a in _LOAD_AXES if _axis_value(a, getattr(c, a)) != want[a]]

    best = min(cands, key=lambda c: (bool(diff(c)), "workload" in diff(c),
                                     "input_len" in diff(c) or "output_len" in diff(c), c.batch_size != 1, c.batch_size, c.input_len, c.output_len, c.cell_id))
    if not diff(best):
        return best.cell_id, "exact"
    return best.cell_id, ("fallback: baseline " + ", ".join(f"{a}={getattr(best, a)}" for a in diff(best))
                          + " (none at " + ", ".join(f"{a}={want[a]}" for a in diff(best)) + ")")


def _noise_pairs(comparable: pd.DataFrame) -> pd.DataFrame:
    """Per engine_key: run-to-run (its batch-1, else smallest-batch, cell: repeat 0 vs 1) and batch
    invariance (that cell vs the largest-batch cell). A cell without repeat 1 gives no rr metrics."""
    order = comparable.assign(_not1=comparable.batch_size != 1).sort_values(
        ["engine_key", "_not1", "batch_size", "input_len", "output_len", "cell_id"])
    small = order.drop_duplicates("engine_key").set_index("engine_key")
    big = order.sort_values(["engine_key", "batch_size"], ascending=[True, False], kind="stable") \
        .drop_duplicates("engine_key").set_index("engine_key")
    rr = pd.DataFrame({"kind": "rr", "key": small.index, "a_cell": small.cell_id.to_numpy(), "a_rep": 0,
                       "b_cell": small.cell_id.to_numpy(), "b_rep": 1})
    multi = big.batch_size.to_numpy() != small.batch_size.to_numpy()
    bi = pd.DataFrame({"kind": "bi", "key": small.index[multi], "a_cell": small.cell_id.to_numpy()[multi], "a_rep": 0,
                       "b_cell": big.cell_id.to_numpy()[multi], "b_rep": 0})
    return pd.concat([rr, bi], ignore_index=True)


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
    if r["status"] != "ok":  # the stored reason may end with pages of engine output: its first line
        why = (r.get("status_reason") or "").strip().splitlines()
        return "n/a", f"status {r['status']}" + (f": {why[0][:200]}" if why else "")
    if not r["has_logprobs"]:
        return "n/a", "no logprobs stored for this cell"
    if r["baseline_cell_id"] is None:
        return "n/a", r["baseline_match"]
    if not (_finite(r["n_positions"]) or _finite(r["n_gen_prompts"])):
        return "n/a", "no logprobs in common with the baseline"
    if _finite(r["token_mismatch"]) and r["token_mismatch"] > 0:
        return "n/a", f"{int(r['token_mismatch'])} teacher-forced tokens differ from the baseline's (another tokenizer?)"
    if r["identical"]:
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
    only = "" if _finite(r["n_positions"]) and r["n_positions"] > 0 else \
        " (text layer only: no teacher-forced logprobs to compare)"
    if level != "lossless":
        return level, "; ".join(why[level]) + only
    if noise_why:
        return "lossless", "not bit-identical; within the baseline's noise floor: " + "; ".join(noise_why) + only
    return "lossless", "not bit-identical; within the lossless tolerances" + only


# ------------------------------------------------------------------ speed

def _ratio(a, b) -> float:
    return float(a) / float(b) if _finite(a) and _finite(b) and b else math.nan


def _runs(x) -> np.ndarray:
    return np.asarray(x if hasattr(x, "__len__") else [], dtype=float)   # None, NaN and pd.NA: no runs


def _speed_intervals(num_runs: list, den_runs: list, run_var: float = 0.0, run_df: float = math.inf) -> tuple[np.ndarray, ...]:
    """(center, lo, hi, n_num, n_den) of the 95% Welch t interval on the log ratio of each cell's runs
    to its baseline's (adapters/intervals.py says why not the bootstrap); the center is the ratio of
    the runs' geometric means. Cells with the same repeat counts stack into one array, so 100k cells
    are a few vectorised calls."""
    center, lo, hi = (np.full(len(num_runs), np.nan) for _ in range(3))
    n_num = np.array([len(n) if len(d) else 0 for n, d in zip(num_runs, den_runs)], dtype=np.int64)
    n_den = np.array([len(d) if len(n) else 0 for n, d in zip(num_runs, den_runs)], dtype=np.int64)
    groups: dict[tuple[int, int], list[int]] = {}
    for i, key in enumerate(zip(n_num.tolist(), n_den.tolist())):
        if key[0] and key[1]:
            groups.setdefault(key, []).append(i)
    for idx in groups.values():
        center[idx], lo[idx], hi[idx] = log_ratio_intervals(np.stack([num_runs[i] for i in idx]),
                                                            np.stack([den_runs[i] for i in idx]), 0.95, run_var, run_df)
    return center, lo, hi, n_num, n_den


def _speed_call(lo: np.ndarray, hi: np.ndarray) -> list:
    """'faster' / 'slower' where the interval excludes 1 above / below, else 'no difference': a
    difference inside the noise is reported as none. None where there is no interval."""
    return [None if not (_finite(a) and _finite(b)) else "faster" if a > 1 else "slower" if b < 1
            else "no difference" for a, b in zip(lo, hi)]


def _add_speed(df: pd.DataFrame, cells: pd.DataFrame) -> None:
    b = cells.set_index("cell_id").reindex(df.baseline_cell_id)
    df["speedup"] = [_ratio(x, y) for x, y in zip(df.output_tok_s, b.output_tok_s)]
    df["ttft_ratio"] = [_ratio(x, y) for x, y in zip(df.ttft_ms_p50, b.ttft_ms_p50)]
    df["mem_saving"] = [1 - _ratio(x, y) for x, y in zip(df.peak_mem_bytes, b.peak_mem_bytes)]
    ok = df.speedup.notna().to_numpy()
    num = [_runs(x) if k else _runs(None) for x, k in zip(df.output_tok_s_runs, ok)]
    _, lo, hi, n_cell, n_base = _speed_intervals(num, [_runs(x) for x in b.output_tok_s_runs])
    df["speedup_lo"], df["speedup_hi"], df["speedup_n_cell"], df["speedup_n_base"] = lo, hi, n_cell, n_base
    df["speed_call"] = _speed_call(lo, hi)


# ------------------------------------------------------------------ the analysis

def analyse(run_dir: str | Path, baseline: dict | None = None, tolerances: Tolerances | None = None) -> pd.DataFrame:
    """One row per cell: axes, status, verdict, reason, quality metrics, noise floors and speed."""
    root = Path(run_dir)
    baseline, tolerances = _settings(root, baseline, tolerances)
    with _duckdb() as con:
        cells = _read_cells(con, root)
        files = _logprob_files(root, cells)
        cells["has_logprobs"] = cells.cell_id.isin(files)
        comparable = cells[(cells.status == "ok") & cells.has_logprobs]
        cells["baseline_cell_id"], cells["baseline_match"] = _resolve_baselines(cells, comparable, baseline)

        # one pairs table, so each logprobs file is read about once for all comparisons
        base = cells[cells.cell_id.isin(comparable.cell_id) & cells.baseline_cell_id.notna()]
        pairs = pd.concat([
            pd.DataFrame({"kind": "base", "key": base.cell_id, "a_cell": base.baseline_cell_id, "a_rep": 0,
                          "b_cell": base.cell_id, "b_rep": 0}),
            _noise_pairs(comparable),
        ], ignore_index=True).astype({"a_rep": "int16", "b_rep": "int16"})
        pairs["pair_id"] = np.arange(len(pairs), dtype=np.int64)
        located = {c: v for c, v in RunStore(root).layout().compacted_rows().items() if files.get(c) == str(v[0])}
        pm = _pair_metrics(con, pairs, files, tolerances.atol, _ref_rows(root), located, journal_layouts(root))
    pm["abs_ppl_rel"] = pm["ppl_rel"].abs()

    df = cells.merge(pm[pm.kind == "base"].drop(columns=["kind", "a_cell", "a_rep", "a_file", "b_cell", "b_rep", "b_file",
                                                         "pair_id"])
                     .rename(columns={"key": "cell_id"}), on="cell_id", how="left")
    _add_speed(df, cells)
    judge(df, pm, df.baseline_cell_id.map(cells.set_index("cell_id").engine_key), tolerances, own_floors=True)
    return _order(df)


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
    for col in _NOISE:
        rr, bi = (floors[k][_COLUMN.get(col, col)].reindex(base_key).to_numpy(dtype=float) for k in ("rr", "bi"))
        df["noise_" + col] = np.fmin(rr, bi) if col in ("top1", "greedy_match", "greedy_close") else np.fmax(rr, bi)
    needed = ["status", "status_reason", "has_logprobs", "baseline_cell_id", "baseline_match", "n_positions",
              "n_gen_prompts", "token_mismatch", "identical", *(_COLUMN.get(c, c) for c in _NOISE),
              *(f"noise_{c}" for c in _NOISE)]
    records = df[needed].to_dict("records")
    for r in records:  # NaN -> None so "missing" reads the same for every column type
        r.update({k: None for k, v in r.items() if isinstance(v, float) and math.isnan(v)})
    df["verdict"], df["reason"] = zip(*[_verdict(r, tolerances) for r in records]) if records else ([], [])


def _order(df: pd.DataFrame) -> pd.DataFrame:
    first = ["cell_id", *AXES, "engine_key", "status", "verdict", "reason", "baseline_cell_id", "baseline_match",
             "max_abs", "mean_abs", "frac_over_atol", "kl_mean", "kl_max", "top1", "greedy_match", "greedy_close",
             "first_div_min", "first_div_mean", "ppl", "ppl_base", "ppl_rel", "identical",
             *[f"noise_{c}" for c in _NOISE], "rr_max_abs", "rr_kl_mean", "rr_identical",
             "bi_max_abs", "bi_kl_mean", "bi_identical", "speedup", "speedup_lo", "speedup_hi", "speed_call",
             "speedup_n_cell", "speedup_n_base", "ttft_ratio",
             "mem_saving", "n_positions", "n_gen_prompts", "n_gen_tokens", "token_mismatch"]
    rest = [c for c in df.columns if c not in first and c != "abs_ppl_rel"]
    return df[first + rest].sort_values([*AXES, "cell_id"], kind="stable", ignore_index=True)
