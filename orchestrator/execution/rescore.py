"""After a run's cells: the baseline's engine scores every sampled cell's samples, teacher forced, so the
sampling layer judges both sides of each comparison under one model's probabilities
(orchestrator/judge/sampling_verdicts.py) instead of each sample under the engine that drew it.

Each sampled cell's baseline is picked as the judge picks it (orchestrator/matrix/baselines.py, the matrix's
selector). Each baseline engine (its engine group) is loaded once, in an engine child of its own placed by Ray
like a group (a Ray task asking for the group's CPUs or GPUs), and scores the repeat-0 samples of every cell
of its model judged against it, its own included (adapters/worker/rescoring.py). The rows go to
rescored.parquet (orchestrator/store/rescored_file.py); a scorer that cannot run leaves its reason on the rows
it did not score, and the judge falls back to each engine's own logprobs, saying why. A resumed run scores
only the samples the table lacks.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd
import pyarrow as pa

from adapters.contract.specs import RESCORED_NPZ, RescoredSample, RescoreSpec
from orchestrator.execution.engine_child.side_work import cell_spec, run_side_work
from orchestrator.execution.engine_child.spec import GroupJob
from orchestrator.matrix.baselines import resolve_baselines
from orchestrator.matrix.cells import Cell
from orchestrator.matrix.models import AXES, Matrix
from orchestrator.store.rescored_file import RESCORED_SCHEMA, read_rescored, write_rescored
from orchestrator.store.run_store import RunStore

KEY = ["scorer_engine_key", "cell_id", "prompt_index", "seed"]


def plan(store: RunStore, selector: dict) -> dict[str, pd.DataFrame]:
    """Scorer cell id -> the repeat-0 samples it scores (cell_id, prompt_index, seed, token_ids), those
    already scored left out."""
    cells = store.read_cells_table(["cell_id", "engine_key", *AXES, "status"]).to_pandas()
    cells["mode"] = cells["mode"].fillna("offline")
    samples = store.read_samples(["cell_id", "repeat", "prompt_index", "seed", "token_ids"]).to_pandas()
    samples = samples[samples.repeat == 0].drop(columns="repeat")
    sampled = cells[(cells.status == "ok") & cells.cell_id.isin(samples.cell_id)].copy()
    if sampled.empty:
        return {}
    sampled["baseline_cell_id"], _ = resolve_baselines(sampled, sampled, selector)
    by_id = sampled.set_index("cell_id")
    done = read_rescored(store.root, [*KEY, "token_ids", "logprobs"]).to_pandas()
    done = done[done.logprobs.notna()]
    scored = set(zip(*(done[k] for k in KEY), (tuple(t) for t in done.token_ids)))
    by_cell = dict(tuple(samples.groupby("cell_id", sort=False)))
    out: dict[str, pd.DataFrame] = {}
    scorers: dict[str, str] = {}      # one loaded engine per baseline engine: its first baseline cell scores
    for cid, base in zip(sampled.cell_id, sampled.baseline_cell_id):
        if base is None or by_id.model[cid] != by_id.model[base]:   # no baseline, or another model's ids
            continue
        key = by_id.engine_key[base]
        scorer = scorers.setdefault(key, base)
        mine = by_cell[cid]
        todo = [(key, cid, p, s, tuple(t)) not in scored for p, s, t in zip(mine.prompt_index, mine.seed, mine.token_ids)]
        if any(todo):
            out[scorer] = pd.concat([out.get(scorer), mine[todo]], ignore_index=True)
    return out


def _score(job: GroupJob, cell: Cell, samples: pd.DataFrame, top_k: int, timeout_s: float
           ) -> tuple[dict[str, np.ndarray] | None, str | None]:
    """In a Ray task: the scorer's engine child with a rescore spec; (its arrays, None) or (None, why)."""
    spec = cell_spec(job, cell)
    if spec.sampling is None:
        return None, "the baseline's group has no sampling prompts"
    rescore = RescoreSpec(prompts=spec.sampling.prompts, top_k=top_k, samples=[
        RescoredSample(prompt_index=int(p), tokens=[int(t) for t in ids])
        for p, ids in zip(samples.prompt_index, samples.token_ids)])
    return run_side_work(job, spec, {"rescore": rescore}, RESCORED_NPZ, timeout_s,
                         lambda f: ({k: f[k] for k in f.files}, None))


def _rows(scorer: str, key: str, samples: pd.DataFrame, arrays: dict | None, why: str | None) -> pa.Table:
    n = len(samples)
    lps = tops = ids = [None] * n
    if arrays is not None:
        lens = arrays["lengths"]
        lps = [arrays["logprobs"][i, :m] for i, m in enumerate(lens)]
        ids = [arrays["topk_ids"][i, :m] for i, m in enumerate(lens)]
        tops = [arrays["topk_logprobs"][i, :m] for i, m in enumerate(lens)]
    return pa.table({
        "scorer_cell_id": [scorer] * n, "scorer_engine_key": [key] * n, "cell_id": samples.cell_id.tolist(),
        "prompt_index": samples.prompt_index.tolist(), "seed": samples.seed.tolist(),
        "token_ids": [list(t) for t in samples.token_ids],
        "logprobs": [None if x is None else x.tolist() for x in lps],
        "topk_ids": [None if x is None else x.tolist() for x in ids],
        "topk_logprobs": [None if x is None else x.tolist() for x in tops],
        "reason": [why] * n}, schema=RESCORED_SCHEMA)


def rescore_samples(m: Matrix, store: RunStore, todo: dict[str, pd.DataFrame], cells: list[Cell],
                    make_job: Callable[[Cell], GroupJob]) -> list[str]:
    """Score what the plan asks, on Ray (started), and store it; returns the lines the run prints (a scorer
    that failed)."""
    import ray

    from orchestrator.execution.scheduling.scheduler import alive_nodes, job_need

    sampling = m.measure.sampling
    by_id = {c.cell_id: c for c in cells}
    timeout_s = m.run.load_timeout_s + m.run.cell_timeout_s
    task = ray.remote(max_retries=0)(_score)
    nodes = list(alive_nodes().values())
    refs = {}
    tables, lines = [], []
    for scorer, samples in todo.items():
        if scorer not in by_id:    # a stored cell the matrix no longer makes: its engine is not known
            lines.append(f"rescoring by {scorer}: not a cell of the run's matrix now; its samples are not rescored")
            continue
        job = make_job(by_id[scorer])
        refs[scorer] = (job, task.options(**job_need(job, nodes).ray_options()).remote(
            job, by_id[scorer], samples, sampling.next_top_k, timeout_s))
    for scorer, (job, ref) in refs.items():
        try:
            arrays, why = ray.get(ref)
        except Exception as err:   # the node or the task died: the rows say so, the run goes on
            arrays, why = None, f"the rescoring task failed: {type(err).__name__}: {err}"
        if why:
            lines.append(f"rescoring by {scorer} ({job.group.framework}) failed: {why.splitlines()[0][:300]}")
        tables.append(_rows(scorer, job.group.engine_key, todo[scorer], arrays, why))
    if not tables:
        return lines
    old = read_rescored(store.root)
    new = pa.concat_tables(tables)
    keep = ~pd.MultiIndex.from_frame(old.select(KEY).to_pandas()).isin(pd.MultiIndex.from_frame(new.select(KEY).to_pandas())) \
        if old.num_rows else np.zeros(0, bool)
    write_rescored(store.root, pa.concat_tables([old.filter(pa.array(keep)), new]) if old.num_rows else new)
    return lines
