"""`judge_run`: the one place a stored run is judged on every layer. `bench compare`, `bench gate`, `bench export`
and the verdict summary `bench run` ends with render what it returns, so two commands never judge the same run
two ways.

    judge_run(RUN)                         every cell against the run's baseline (or `baseline=`, a selector)
    judge_run(RUN, against=OLD)            every cell against the same configuration in a stored run

The layers themselves are computed where they are defined: logits, text and speed in analysis.py (one run) and
cross_run.py (two runs), tasks in task_verdicts.py, samples in sampling_verdicts.py; where the layers disagree,
reconcile.py. Here they are only put side by side."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa

from orchestrator.matrix.models import Tolerances
from orchestrator.store.run_store import RunStore


# The one schema of each table judge_run returns: the columns the judge adds, typed, beside the stored columns every
# table carries (orchestrator/store/schema.py: the cell's axes and, in `cells`, every stored cells column). Readers
# (report/, the exports) read these names; tests/unit/test_one_judge.py holds every frame to them, so a column
# added to a layer is declared here or fails there.
CELL_VERDICT_COLUMNS = pa.schema([
    ('verdict', pa.string()),
    ('verdict_reason', pa.string()),
    ('baseline_cell_id', pa.string()),
    ('baseline_match', pa.string()),
    ('max_abs', pa.float64()),
    ('mean_abs', pa.float64()),
    ('frac_over_atol', pa.float64()),
    ('kl_mean', pa.float64()),
    ('kl_max', pa.float64()),
    ('top1', pa.float64()),
    ('greedy_match', pa.float64()),
    ('greedy_close', pa.float64()),
    ('first_div_min', pa.float64()),
    ('first_div_mean', pa.float64()),
    ('ppl', pa.float64()),
    ('ppl_base', pa.float64()),
    ('ppl_rel', pa.float64()),
    ('identical', pa.bool_()),
    ('noise_max_abs', pa.float64()),
    ('noise_kl_mean', pa.float64()),
    ('noise_top1', pa.float64()),
    ('noise_greedy_match', pa.float64()),
    ('noise_greedy_close', pa.float64()),
    ('noise_ppl_rel', pa.float64()),
    ('noise_kl_max', pa.float64()),
    ('rr_max_abs', pa.float64()),
    ('rr_kl_mean', pa.float64()),
    ('rr_identical', pa.bool_()),
    ('bi_max_abs', pa.float64()),
    ('bi_kl_mean', pa.float64()),
    ('bi_identical', pa.bool_()),
    ('speedup', pa.float64()),
    ('speedup_lo', pa.float64()),
    ('speedup_hi', pa.float64()),
    ('speed_call', pa.string()),
    ('speed_p', pa.float64()),       # the test the speed-up's interval inverts
    ('speed_q', pa.float64()),       # p adjusted over the run's speed tests (orchestrator/judge/families.py)
    ('speedup_n_cell', pa.int64()),
    ('speedup_band_lo', pa.float64()),   # the interval at the speed family's level (what bench gate's bounds read)
    ('speedup_band_hi', pa.float64()),
    ('speedup_n_base', pa.int64()),
    ('ttft_ratio', pa.float64()),
    ('mem_saving', pa.float64()),
    ('n_positions', pa.float64()),
    ('n_gen_prompts', pa.float64()),
    ('n_gen_tokens', pa.float64()),
    ('token_mismatch', pa.float64()),
    ('has_logprobs', pa.bool_()),
    ('speed_test', pa.string()),
    ('speed_reason', pa.string()),   # why speed_call is 'cannot judge' (the host was busy)
    ('speed_drift_sd', pa.float64()),   # log sd of the run's drift a Welch interval was widened by (NaN: none)
    ('speed_drift', pa.string()),       # where that drift came from (the cells measured twice), or null
    ('task_verdict', pa.string()),
    ('task_reason', pa.string()),
    ('sampling_verdict', pa.string()),
])

PAIR_VERDICT_COLUMNS = pa.schema([
    ('only_in', pa.string()),
    ('old_status', pa.string()),
    ('tok_s_ratio', pa.float64()),
    ('tok_s_lo', pa.float64()),
    ('tok_s_hi', pa.float64()),
    ('tok_s_call', pa.string()),
    ('tok_s_p', pa.float64()),
    ('tok_s_q', pa.float64()),
    ('tok_s_band_lo', pa.float64()),
    ('tok_s_band_hi', pa.float64()),
    ('ttft_p50_ratio', pa.float64()),
    ('ttft_p50_lo', pa.float64()),
    ('ttft_p50_hi', pa.float64()),
    ('ttft_p50_call', pa.string()),
    ('ttft_p50_p', pa.float64()),
    ('ttft_p50_q', pa.float64()),
    ('ttft_p50_band_lo', pa.float64()),
    ('ttft_p50_band_hi', pa.float64()),
    ('ttft_p99_ratio', pa.float64()),
    ('ttft_p99_lo', pa.float64()),
    ('ttft_p99_hi', pa.float64()),
    ('ttft_p99_call', pa.string()),
    ('ttft_p99_p', pa.float64()),
    ('ttft_p99_q', pa.float64()),
    ('ttft_p99_band_lo', pa.float64()),
    ('ttft_p99_band_hi', pa.float64()),
    ('tpot_p50_ratio', pa.float64()),
    ('tpot_p50_lo', pa.float64()),
    ('tpot_p50_hi', pa.float64()),
    ('tpot_p50_call', pa.string()),
    ('tpot_p50_p', pa.float64()),
    ('tpot_p50_q', pa.float64()),
    ('tpot_p50_band_lo', pa.float64()),
    ('tpot_p50_band_hi', pa.float64()),
    ('tpot_p99_ratio', pa.float64()),
    ('tpot_p99_lo', pa.float64()),
    ('tpot_p99_hi', pa.float64()),
    ('tpot_p99_call', pa.string()),
    ('tpot_p99_p', pa.float64()),
    ('tpot_p99_q', pa.float64()),
    ('tpot_p99_band_lo', pa.float64()),
    ('tpot_p99_band_hi', pa.float64()),
    ('mem_ratio', pa.float64()),
    ('changed', pa.string()),
    ('run_noise', pa.string()),
    ('tok_s_run_sd', pa.float64()),
    ('tok_s_n', pa.string()),
    ('ttft_p50_run_sd', pa.float64()),
    ('ttft_p50_n', pa.string()),
    ('ttft_p99_run_sd', pa.float64()),
    ('ttft_p99_n', pa.string()),
    ('tpot_p50_run_sd', pa.float64()),
    ('tpot_p50_n', pa.string()),
    ('tpot_p99_run_sd', pa.float64()),
    ('tpot_p99_n', pa.string()),
])

TASK_VERDICT_COLUMNS = pa.schema([
    ('task', pa.string()),
    ('baseline_cell_id', pa.string()),
    ('metric', pa.string()),
    ('aggregation', pa.string()),
    ('n', pa.int64()),
    ('score', pa.float64()),
    ('score_lo', pa.float64()),
    ('score_hi', pa.float64()),
    ('n_paired', pa.int64()),
    ('base_score', pa.float64()),
    ('cell_score', pa.float64()),
    ('change', pa.float64()),
    ('change_lo', pa.float64()),
    ('change_hi', pa.float64()),
    ('ratio', pa.float64()),
    ('ratio_lo', pa.float64()),
    ('ratio_hi', pa.float64()),
    ('ratio_dropped', pa.int64()),
    ('test', pa.string()),
    ('p_value', pa.float64()),
    ('q_value', pa.float64()),       # p adjusted over the run's task tests (orchestrator/judge/families.py)
    ('change_se', pa.float64()),
    ('family_level', pa.float64()),  # the per-test level the family held: a test not called needed p below it
    ('family_size', pa.int64()),     # the tests in the family (every judged (cell, task) of the run)
    ('worse', pa.int64()),
    ('better', pa.int64()),
    ('mde', pa.float64()),
    ('mde_rel', pa.float64()),
    ('items_needed', pa.int64()),
    ('verdict', pa.string()),
    ('noise_items', pa.int64()),
    ('task_verdict', pa.string()),
    ('task_reason', pa.string()),
])

SAMPLING_VERDICT_COLUMNS = pa.schema([
    ('baseline_cell_id', pa.string()),
    ('samples_n', pa.int64()),
    ('repeatable', pa.float64()),
    ('dist_scored_by', pa.string()),
    ('dist_shift_own', pa.float64()),
    ('dist_rescore_reason', pa.string()),
    ('dist_shift', pa.float64()),
    ('dist_p', pa.float64()),
    ('dist_n_base', pa.int64()),
    ('dist_n_cell', pa.int64()),
    ('dist_seeds_base', pa.int64()),
    ('dist_seeds_cell', pa.int64()),
    ('dist_test', pa.string()),
    ('first_p', pa.float64()),
    ('first_n', pa.int64()),
    ('first_prompts', pa.int64()),
    ('first_outside', pa.int64()),
    ('first_test', pa.string()),
    ('first_reason', pa.string()),
    ('whole_reason', pa.string()),
    ('model_test', pa.string()),
    ('model_p', pa.float64()),
    ('sampling_p', pa.float64()),    # the cell's tests together: min(1, tests x the smallest p) (Bonferroni)
    ('sampling_q', pa.float64()),    # sampling_p adjusted over the run's sampling cells (orchestrator/judge/families.py)
    ('dist_level', pa.float64()),
    ('dist_detectable', pa.float64()),
    ('seeds_needed', pa.int64()),
    ('sampler_note', pa.string()),
    ('settings_changed', pa.string()),
    ('served_verdict', pa.string()),
    ('model_verdict', pa.string()),
    ('dist_verdict', pa.string()),
    ('seeds_for_shift', pa.float64()),
    ('seed_identical', pa.float64()),
    ('seed_first_div_mean', pa.float64()),
    ('seed_promised', pa.bool_()),
    ('seed_verdict', pa.string()),
    ('sampling_verdict', pa.string()),
    ('sampling_reason', pa.string()),
])


def undeclared(frame: pd.DataFrame, *schemas: pa.Schema) -> list[str]:
    """The columns of a judged frame that neither the stored cells schema nor `schemas` declare."""
    from orchestrator.store.schema import CELLS_SCHEMA

    known = set(CELLS_SCHEMA.names).union(*(s.names for s in schemas))
    return [c for c in frame.columns if c not in known]


@dataclass(frozen=True)
class Verdicts:
    """What a run's judgement holds. `cells`: one row per cell, the logit, text and speed verdicts with the figures
    behind them, plus each cell's task summary (`task_verdict`, `task_reason`) and `sampling_verdict` where those
    layers were judged; `tasks`: one row per (cell, task), None where the task layer was not asked for;
    `sampling`: one row per cell with samples, likewise; `disagree`: cell_id -> the line that says how its
    layers' disagreeing verdicts are both true; `alpha`: the task layer's level; `against`: OLD, or None;
    `errors`: layer ("tasks", "sampling") -> why it could not be judged (with keep_going; the layer is then None)."""
    cells: pd.DataFrame
    tasks: pd.DataFrame | None
    sampling: pd.DataFrame | None
    disagree: dict[str, str] = field(default_factory=dict)
    alpha: float = 0.05
    against: Path | None = None
    errors: dict[str, str] = field(default_factory=dict)
    sampling_alpha: float = 0.01

    def family_lines(self) -> list[str]:
        """Per layer judged, how many tests its family held and how many it called (orchestrator/judge/families.py):
        'tasks: 0 of 33 tests called at FDR 0.05 (Benjamini-Hochberg)'."""
        out = []
        t = self.tasks
        if t is not None and "q_value" in t and t.q_value.notna().any():
            tested = t[t.cell_id != t.baseline_cell_id]
            out.append(f"tasks: {int(tested.task_verdict.isin(('improved', 'regressed')).sum())} of "
                       f"{int(tested.q_value.notna().sum())} tests called at FDR {self.alpha:g} (Benjamini-Hochberg)")
        c = self.cells
        if "speed_q" in c and c.speed_p.notna().any():
            tested = c[(c.cell_id != c.baseline_cell_id) & (c.get("status", "ok") == "ok") & c.speed_p.notna()]
            out.append(f"speed: {int(tested.speed_call.isin(('faster', 'slower')).sum())} of {len(tested)} tests "
                       "called at FDR 0.05 (Benjamini-Hochberg)")
        s = self.sampling
        if s is not None and "sampling_q" in s and s.sampling_p.notna().any():
            tested = s[(s.cell_id != s.baseline_cell_id) & s.sampling_p.notna()]
            out.append(f"sampling: {int((tested.sampling_q < self.sampling_alpha).sum())} of {len(tested)} cells "
                       f"called at FDR {self.sampling_alpha:g} (Benjamini-Hochberg)")
        return out

    def disagree_lines(self) -> list[str]:
        """'layers disagree:' and one line per such cell, named by what tells it apart from the others."""
        from orchestrator.judge.reconcile import disagree_lines

        return disagree_lines(self.cells, self.disagree)


def judge_run(run: str | Path, *, against: str | Path | None = None, baseline: dict | None = None,
              tolerances: Tolerances | None = None, match: list[str] | None = None,
              noise_run: str | Path | None = None, history: str | Path | None = None,
              tasks: bool = True, sampling: bool = True, keep_going: bool = False) -> Verdicts:
    """Judge `run` on every layer (tasks=False / sampling=False leave a layer out: the gate asks only for what its
    rules read). With `against`, every cell against the same configuration in OLD (`match`: pair on these axes;
    `noise_run` / `history`: the run-to-run noise of the speed calls, default the folder holding OLD). Raises
    ValueError for arguments that do not go together. keep_going: a task or sampling layer that fails is left out
    with its reason in `errors` (the report still shows the rest); the logit, text and speed layers always raise.
    A compaction that commits while it reads: read again once (orchestrator/store/run_store.py: once_more)."""
    from orchestrator.store.run_store import once_more

    return once_more(lambda: _judge_run(run, against, baseline, tolerances, match, noise_run, history, tasks,
                                        sampling, keep_going))


def _judge_run(run, against, baseline, tolerances, match, noise_run, history, tasks, sampling,
               keep_going) -> Verdicts:
    from orchestrator.judge.reconcile import reconcile

    errors: dict[str, str] = {}

    def layer(name: str, wanted: bool, compute):
        if not wanted:
            return None
        try:
            return compute()
        except Exception as e:   # noqa: BLE001 - said in `errors` where the caller asked to keep going
            if not keep_going:
                raise
            errors[name] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            return None

    if against is not None:
        if baseline:
            raise ValueError("--baseline and --against exclude each other: with --against, OLD's cell is the baseline")
        from orchestrator.judge.cross_run import compare_runs
        from orchestrator.judge.sampling_verdicts import compare_sampling_runs
        from orchestrator.judge.task_verdicts import compare_task_runs

        old = Path(against)
        cells = compare_runs(run, old, match, tolerances, noise_run, history or old.parent)
        tv = layer("tasks", tasks, lambda: compare_task_runs(run, old, cells, tolerances))
        sv = layer("sampling", sampling, lambda: compare_sampling_runs(run, old, cells, tolerances))
    else:
        if match or noise_run or history:
            raise ValueError("--match, --noise-run and --history are for two runs: give --against OLD_RUN")
        from orchestrator.judge.analysis import analyse
        from orchestrator.judge.sampling_verdicts import analyse_sampling
        from orchestrator.judge.task_verdicts import analyse_tasks

        old = None
        cells = analyse(run, baseline=baseline, tolerances=tolerances)
        tv = layer("tasks", tasks, lambda: analyse_tasks(run, baseline=baseline, tolerances=tolerances))
        sv = layer("sampling", sampling, lambda: analyse_sampling(run, baseline=baseline, tolerances=tolerances))
    if tv is not None:
        from orchestrator.judge.task_verdicts import summarize_tasks

        cells = cells.merge(summarize_tasks(tv), on="cell_id", how="left")
    if sv is not None:
        cells = cells.merge(sv[["cell_id", "sampling_verdict"]], on="cell_id", how="left")
    tol = tolerances or RunStore(run).read_manifest().tolerances
    return Verdicts(cells, tv, sv, reconcile(cells, tv, sv, tol.task_alpha), tol.task_alpha, old, errors,
                    tol.sampling_alpha)
