"""The speed figures of a cell against another: speedup = output_tok_s / the other's (a paired-timing row: against
the baseline's repeats taken in turns with its own, the geometric mean of the pairs' ratios), with a 95% CI
(speedup_lo/hi): the Welch t interval on the log ratio of the per-repeat throughputs
(adapters/contract/intervals.py; the bootstrap under-covers at 3 repeats), over speedup_n_cell /
speedup_n_base repeats (0: none); speed_p: the test that interval inverts (p < 0.05 where it excludes 1);
speed_q: p adjusted over the run's speed tests (orchestrator/judge/families.py, Benjamini-Hochberg at
SPEED_ALPHA); speed_call = faster / slower where q < SPEED_ALPHA; otherwise "no difference" only when the
interval at the family's level (1 - the level a test not called had to beat) lies within
1 / (1 + speed_tolerance) .. 1 + speed_tolerance (the test could have seen a change of the tolerance's size),
else "not distinguishable" (a change of that size may hide in the noise); null without an interval;
ttft_ratio; mem_saving = 1 - peak_mem / the other's.

An env pair (a cell and its baseline the same configuration in two matrix envs, their timed repeats taken in
turns on one node: repeat_started_at / repeat_ended_at never overlap) is paired: the interval is the t
interval of the mean log ratio of repeat i to the baseline's repeat i (n pairs, n - 1 degrees of freedom), so
host drift that falls on both sides of a pair drops out. `speed_test` says which test each interval is.
measure.paired_timing gives a cell such a pair: its baseline's batch timed again in turns with the cell's repeats,
inside the cell's engine where the baseline is in its engine load (adapters/worker/timing_partner.py: batch 4
against batch 1), or with `true` in the baseline's engine loaded beside it on its node (a timing twin); those
repeats are stored on the cell's row (base_output_tok_s_runs, base_timing_cell, base_repeat_started_at / ended_at,
base_host_busy_runs): where they took turns (timing_paired), the cell's interval is the paired one against them,
not Welch against the baseline's own row.

Drift inside the run: a cell whose timed batch was measured a second time later in the run
(output_tok_s_recheck_runs: each group's drift check, adapters.worker.group) shows how far the host moved between the two; pooled
over the run's re-measured cells by run_noise (adapters/contract/intervals.py, the same estimate that widens
intervals across runs), that between-measurement variance widens every Welch interval of the run (a cell
and its baseline ran minutes apart, as two measurements of one batch did); speed_drift_sd / speed_drift say
by how much and from what. A paired interval is not widened: a drift shared by both sides falls out of it.

A Welch call whose cell or baseline had more than MAX_DISTURBED of its timed repeats disturbed by the rest of
the host (per-repeat shares in host_busy_runs / gpu_busy_runs) is `cannot judge`, and speed_reason says why. A
paired call is `cannot judge` only where more than MAX_DISTURBED of its pairs were split by the load (one repeat
disturbed, the other not): a load on both repeats of a pair falls out of their ratio.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from adapters.contract.disturbance import DISTURBED_SHARE, disturbed_repeats, split_pairs  # noqa: F401 (the report's too)
from adapters.contract.intervals import (log_mean_intervals, log_mean_p, log_ratio_intervals, log_ratio_p,
                                        run_noise)
from orchestrator.judge.families import BH, family
from orchestrator.values import finite

# the speed layer's level: its intervals are 95%, its calls control the false discovery rate at 5%
SPEED_ALPHA = 0.05


def ratio(a, b) -> float:
    return float(a) / float(b) if finite(a) and finite(b) and b else math.nan


def _runs(x) -> np.ndarray:
    return np.asarray(x if hasattr(x, "__len__") else [], dtype=float)   # None, NaN and pd.NA: no runs


def speed_intervals(num_runs: list, den_runs: list, run_var: float = 0.0, run_df: float = math.inf,
                    level: float = 0.95) -> tuple[np.ndarray, ...]:
    """(center, lo, hi, n_num, n_den) of the `level` Welch t interval on the log ratio of each cell's runs
    to its baseline's (adapters/contract/intervals.py says why not the bootstrap); the center is the ratio of
    the runs' geometric means. Cells with the same repeat counts stack into one array, so 100k cells
    are a few vectorised calls."""
    center, lo, hi = (np.full(len(num_runs), np.nan) for _ in range(3))
    n_num, n_den, groups = _by_counts(num_runs, den_runs)
    for idx in groups.values():
        center[idx], lo[idx], hi[idx] = log_ratio_intervals(np.stack([num_runs[i] for i in idx]),
                                                            np.stack([den_runs[i] for i in idx]), level, run_var, run_df)
    return center, lo, hi, n_num, n_den


def speed_p(num_runs: list, den_runs: list, run_var: float = 0.0, run_df: float = math.inf) -> np.ndarray:
    """The p of the Welch t test each interval of speed_intervals inverts (NaN where there is none)."""
    p = np.full(len(num_runs), np.nan)
    for idx in _by_counts(num_runs, den_runs)[2].values():
        p[idx] = log_ratio_p(np.stack([num_runs[i] for i in idx]), np.stack([den_runs[i] for i in idx]),
                             run_var, run_df)
    return p


def _by_counts(num_runs: list, den_runs: list):
    """(n_num, n_den, {(n_num, n_den): row indices}): the rows that stack into one array."""
    n_num = np.array([len(n) if len(d) else 0 for n, d in zip(num_runs, den_runs)], dtype=np.int64)
    n_den = np.array([len(d) if len(n) else 0 for n, d in zip(num_runs, den_runs)], dtype=np.int64)
    groups: dict[tuple[int, int], list[int]] = {}
    for i, key in enumerate(zip(n_num.tolist(), n_den.tolist())):
        if key[0] and key[1]:
            groups.setdefault(key, []).append(i)
    return n_num, n_den, groups


def speed_call(lo: np.ndarray, hi: np.ndarray, tolerance: float, q=None, center=None, alpha: float = SPEED_ALPHA,
               band_lo=None, band_hi=None) -> list:
    """'faster' / 'slower' where the interval excludes 1 above / below (with `q`: where q < alpha, the way
    `center` lies); otherwise 'no difference' if the interval (with `q`: `band_lo` .. `band_hi`, the interval at
    the family's level) lies within 1 / (1 + tolerance) .. 1 + tolerance, else 'not distinguishable': the test
    could not have seen a change of the tolerance's size. None where there is no interval."""
    if q is None:
        q = [0.0 if finite(a) and (a > 1 or b < 1) else 1.0 for a, b in zip(lo, hi)]
        center = [math.sqrt(a * b) if finite(a) and finite(b) else math.nan for a, b in zip(lo, hi)]
        band_lo, band_hi = lo, hi
    return [None if not (finite(a) and finite(b)) else ("faster" if c > 1 else "slower") if finite(x) and x < alpha
            else "no difference" if u >= 1 / (1 + tolerance) and v <= 1 + tolerance else "not distinguishable"
            for a, b, x, c, u, v in zip(lo, hi, q, center, band_lo, band_hi)]


PAIRED, WELCH = "paired t", "Welch t"


def took_turns(a_start, a_end, b_start, b_end) -> bool:
    """Whether two cells' timed repeats ran in turns: as many on each side, wall-clock times recorded, and no
    repeat of one overlapping a repeat of the other."""
    spans = [list(zip(_runs(s), _runs(e))) for s, e in ((a_start, a_end), (b_start, b_end))]
    if len(spans[0]) < 2 or len(spans[0]) != len(spans[1]):
        return False
    return not any(s1 < e2 and s2 < e1 for s1, e1 in spans[0] for s2, e2 in spans[1])


def paired_intervals(num_runs: list, den_runs: list, level: float = 0.95) -> tuple[np.ndarray, ...]:
    """(center, lo, hi, p) of the `level` t interval of the geometric mean of num_i / den_i, the paired ratio,
    and the p of the t test it inverts."""
    center, lo, hi, p = (np.full(len(num_runs), np.nan) for _ in range(4))
    groups: dict[int, list[int]] = {}
    for i, (n, d) in enumerate(zip(num_runs, den_runs)):
        if len(n) >= 2 and len(n) == len(d):
            groups.setdefault(len(n), []).append(i)
    for idx in groups.values():
        ratios = np.stack([num_runs[i] for i in idx]) / np.stack([den_runs[i] for i in idx])
        center[idx], lo[idx], hi[idx] = log_mean_intervals(ratios, level)
        p[idx] = log_mean_p(ratios)
    return center, lo, hi, p


def env_paired(df: pd.DataFrame, base: pd.DataFrame) -> np.ndarray:
    """Which rows and their baselines are an env pair that took turns (see the module's docstring)."""
    if "env" not in df or "repeat_started_at" not in df:
        return np.zeros(len(df), bool)
    return np.array([isinstance(e, str) and isinstance(be, str) and e != be and m == "exact"
                     and took_turns(s, t, bs, bt) for e, be, m, s, t, bs, bt in zip(
                         df.env, base.env, df.baseline_match, df.repeat_started_at, df.repeat_ended_at,
                         base.repeat_started_at, base.repeat_ended_at)], bool)


def timing_paired(df: pd.DataFrame) -> np.ndarray:
    """Which rows carry their baseline's timed repeats taken in turns with theirs (measure.paired_timing: the
    baseline's engine loaded beside the cell's, CellRecord.base_*): the twin's cell is the cell's baseline and
    no repeat of one overlapped a repeat of the other."""
    if "base_timing_cell" not in df:
        return np.zeros(len(df), bool)
    return np.array([isinstance(t, str) and t == b and took_turns(s, e, bs, be) for t, b, s, e, bs, be in zip(
        df.base_timing_cell, df.baseline_cell_id, df.repeat_started_at, df.repeat_ended_at,
        df.base_repeat_started_at, df.base_repeat_ended_at)], bool)


def family_calls(num: list, den: list, center, lo, hi, p, out, tolerance: float, run_var: float = 0.0,
                 run_df: float = math.inf, paired=None) -> tuple[np.ndarray, list, np.ndarray, np.ndarray]:
    """(q, calls, band_lo, band_hi): each test's q over the family of the tests not `out`
    (orchestrator/judge/families.py: BH at SPEED_ALPHA; an `out` row keeps its p as q), speed_call's words: faster
    / slower where q < SPEED_ALPHA, "no difference" only where the interval at the family's level (1 - the level a
    test not called had to beat) lies within the tolerance; and that interval (the band: what a bound on the ratio,
    bench gate's max_slowdown, is judged by, so a family of bounds holds the family's level too). `paired`: the
    rows whose interval is the paired one (paired_intervals)."""
    fam = family(np.where(out, np.nan, p), SPEED_ALPHA, BH)
    q = np.where(out, p, fam.q)
    _, band_lo, band_hi, *_ = speed_intervals(num, den, run_var, run_df, level=1 - fam.level)
    if paired is not None and paired.any():
        at = np.flatnonzero(paired)
        _, band_lo[paired], band_hi[paired], _ = paired_intervals([num[i] for i in at], [den[i] for i in at],
                                                                  1 - fam.level)
    return q, speed_call(lo, hi, tolerance, q, center, SPEED_ALPHA, band_lo, band_hi), band_lo, band_hi


def run_drift(cells: pd.DataFrame) -> tuple[float, float, str | None]:
    """(variance, degrees of freedom, source) of the drift inside one run: the log throughput of each batch
    measured twice, pooled by run_noise, the one estimate of a between-measurement variance. Measured twice: a
    group's drift-check cell (output_tok_s_recheck_runs beside output_tok_s_runs), and a baseline cell timed
    again by a timing twin (measure.paired_timing: a row's base_output_tok_s_runs beside the baseline row's own
    output_tok_s_runs, one pair per twin). (0, inf, None) where no batch was measured twice."""
    pairs = []
    if "output_tok_s_recheck_runs" in cells:
        pairs += [(_runs(a), _runs(b)) for a, b in zip(cells.output_tok_s_runs, cells.output_tok_s_recheck_runs)]
    if "base_timing_cell" in cells:
        own = dict(zip(cells.cell_id, cells.output_tok_s_runs))
        pairs += [(_runs(own.get(c)), _runs(b)) for c, b in zip(cells.base_timing_cell, cells.base_output_tok_s_runs)
                  if isinstance(c, str)]
    pairs = [(a, b) for a, b in pairs if len(a) >= 2 and len(b) >= 2]
    if not pairs:
        return 0.0, math.inf, None
    var, dof = run_noise([a for a, _ in pairs], [b for _, b in pairs])
    return var, dof, f"{len(pairs)} cell(s) measured twice in this run"


def add_speed(df: pd.DataFrame, cells: pd.DataFrame, tolerance: float) -> None:
    b = cells.set_index("cell_id").reindex(df.baseline_cell_id)
    df["speedup"] = [ratio(x, y) for x, y in zip(df.output_tok_s, b.output_tok_s)]
    df["ttft_ratio"] = [ratio(x, y) for x, y in zip(df.ttft_ms_p50, b.ttft_ms_p50)]
    df["mem_saving"] = [1 - ratio(x, y) for x, y in zip(df.peak_mem_bytes, b.peak_mem_bytes)]
    ok = df.speedup.notna().to_numpy()
    num = [_runs(x) if k else _runs(None) for x, k in zip(df.output_tok_s_runs, ok)]
    twin = timing_paired(df)   # the baseline measured in turns with the cell: those repeats are its side
    own = df["base_output_tok_s_runs"] if twin.any() else b.output_tok_s_runs
    den = [_runs(t) if tw else _runs(x) for x, t, tw in zip(b.output_tok_s_runs, own, twin)]
    drift_var, drift_df, drift_from = run_drift(cells)
    center, lo, hi, n_cell, n_base = speed_intervals(num, den, drift_var, drift_df)
    # a timing twin's row: the speedup is against the baseline's repeats taken in turns (the geometric mean of the
    # pairs' ratios), not the baseline's own row, timed at another moment
    df["speedup"] = np.where(twin & np.isfinite(center), center, df.speedup.to_numpy(dtype=float))
    p = speed_p(num, den, drift_var, drift_df)
    paired = (env_paired(df, b) | twin) & (n_cell > 0)
    at = np.flatnonzero(paired)
    if paired.any():   # the paired ratio (its center: the geometric mean of the ratios, the same as Welch's)
        _, lo[paired], hi[paired], p[paired] = paired_intervals([num[i] for i in at], [den[i] for i in at])
    # the family: every speed test of the run's ok cells (the baseline against itself is none)
    out = ((df.cell_id == df.baseline_cell_id) | (df.get("status", "ok") != "ok")).to_numpy()
    q, calls, band_lo, band_hi = family_calls(num, den, center, lo, hi, p, out, tolerance, drift_var, drift_df,
                                              paired=paired)
    df["speedup_lo"], df["speedup_hi"], df["speedup_n_cell"], df["speedup_n_base"] = lo, hi, n_cell, n_base
    df["speedup_band_lo"], df["speedup_band_hi"] = band_lo, band_hi
    df["speed_p"], df["speed_q"], df["speed_call"] = p, q, calls
    df["speed_test"] = [None if not (finite(a) and finite(z)) else PAIRED if pr else WELCH
                        for a, z, pr in zip(lo, hi, paired)]
    widened = (df.speed_test == WELCH).to_numpy() & (drift_from is not None)
    df["speed_drift_sd"] = np.where(widened, math.sqrt(drift_var), np.nan)
    df["speed_drift"] = [drift_from if w else None for w in widened]
    withhold_busy(df, b, paired, twin)


# a speed call is withheld ("cannot judge") where more than this share of a side's timed repeats were disturbed
# (adapters/contract/disturbance.py: other processes took more than DISTURBED_SHARE of the engine cores or GPU):
# one disturbed repeat in six widens a t interval; more move its center, which the interval cannot show
MAX_DISTURBED = 0.25


def host_busy_reason(cell_cpu, cell_gpu, base_cpu, base_gpu, paired: bool = False) -> str | None:
    """Why the host's load leaves a speed call unjudgeable, or None. Welch (the two sides timed apart): where more
    than MAX_DISTURBED of either side's repeats were disturbed ('host busy during 4 of 6 repeats'). Paired (repeats
    in turns): a load that fell on both repeats of a pair falls out of their ratio, so only the pairs the load
    split (one repeat disturbed, the other not) count ('host load split 2 of 6 pairs')."""
    if paired:
        counted = split_pairs(cell_cpu, cell_gpu, base_cpu, base_gpu)
        if counted and counted[0] > MAX_DISTURBED * counted[1]:
            return f"host load split {counted[0]} of {counted[1]} pairs (one repeat disturbed, the other not)"
        if counted:
            return None
    parts = []
    for side, cpu, gpu in (("", cell_cpu, cell_gpu), (" of the baseline", base_cpu, base_gpu)):
        counted = disturbed_repeats(cpu, gpu)
        if counted and counted[0] > MAX_DISTURBED * counted[1]:
            parts.append(f"host busy during {counted[0]} of {counted[1]} repeats{side}")
    return "; ".join(parts) or None


def withhold_busy(df: pd.DataFrame, base: pd.DataFrame, paired=None, twin=None) -> None:
    """speed_call = 'cannot judge' where the host was busy (host_busy_reason), speed_reason says so. `paired`: the
    rows judged by the paired interval; `twin`: those whose baseline side is their own base_* columns."""
    def col(frame, name):
        return frame[name].tolist() if name in frame else [None] * len(frame)
    n = len(df)
    paired = np.zeros(n, bool) if paired is None else paired
    twin = np.zeros(n, bool) if twin is None else twin
    base_cpu = [o if t else x for x, o, t in zip(col(base, "host_busy_runs"), col(df, "base_host_busy_runs"), twin)]
    base_gpu = [o if t else x for x, o, t in zip(col(base, "gpu_busy_runs"), col(df, "base_gpu_busy_runs"), twin)]
    reasons = [host_busy_reason(*x) for x in zip(col(df, "host_busy_runs"), col(df, "gpu_busy_runs"),
                                                  base_cpu, base_gpu, paired.tolist())]
    df["speed_reason"] = reasons
    df["speed_call"] = [c if c is None or why is None else "cannot judge" for c, why in zip(df.speed_call, reasons)]
