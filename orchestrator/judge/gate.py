"""`bench gate`: a policy file of rules (axis values -> what their cells must reach) checked against
the verdicts of orchestrator/judge/analysis.py (one run: each cell against its baseline) or of
orchestrator/judge/cross_run.py (`--against OLD`: each cell against the same config in a stored run).

    bench gate RUN --policy policy.yaml [--against OLD_RUN] [--junit FILE] [--format md]
        checks = evaluate(analyse(RUN) or compare_runs(RUN, OLD), load_policy(path), against=...)
        exit 1 when any check failed, 2 for a usage error (PolicyError)

    policy.yaml:
        rules:
          - match: {framework: vllm, quantization: [fp16, bf16]}   # list: each value must be present
            must_be: lossless                                     # identical | lossless | near-lossless
            max_slowdown: 0.05            # --against (or an env pair: match env): output tokens/s may not drop by more than 5%
            max_ttft_p99_increase: 0.10   # --against: TTFT p99 may not rise by more than 10%
            max_memory_increase: 0.05     # --against: peak memory may not rise by more than 5%
            task: {name: tiny-ending, min_ratio: 0.99, no_regression: true}   # the task layer
            sampling: {same_distribution: true}   # the sampling layer (or identical: true)
            max_error_rate: 0.01          # served and stream cells: failed requests / requests sent
    With --noise-run OLD_REPEAT (OLD's matrix run again), or earlier runs of OLD's configurations under
    --history (default: the folder holding OLD), the intervals also hold the run-to-run drift the
    repeats inside one run cannot see; without either a speed bound is not checked and says so
    (require_run_noise: true fails it as "cannot judge").
    A matched cell fails must_be when its verdict is worse (or n/a: not ok, no logprobs, no partner in
    OLD); so does a combination of listed values no cell has (a value no cell has at all, or a task the
    run did not run, is a PolicyError: exit 2). A speed bound fails only when the NEW/OLD ratio's interval at the
    speed family's level (the band: the 95% interval widened to the per-test level the run's Benjamini-Hochberg
    family of that metric held, orchestrator/judge/speed.py) lies wholly beyond it, so noise alone never fails a
    build, however many cells a policy bounds; a ratio with no interval
    (fewer than 2 repeats on a side) cannot show that, and fails as "cannot judge". Peak memory is one
    number per cell: its bound is checked on the ratio itself. A task rule reads the task layer
    (orchestrator/judge/task_verdicts.py): min_ratio fails when the 95% interval of the metric's ratio to the
    baseline's (OLD's with --against) lies wholly below it, no_regression when the paired test finds a
    regression; a cell without the task's rows, or a baseline without them, fails as "cannot judge".
    A sampling rule reads the sampling layer (orchestrator/judge/sampling_verdicts.py): identical fails unless
    every seeded sample equals the baseline's with the same seed (where both sides promise it),
    same_distribution when the distribution tests find a difference, or the served distributions differ
    from another sampler (unless accept_sampler_difference); a cell without samples, with a verdict of n/a,
    or 'not distinguishable' (unless accept_underpowered), fails as "cannot judge".
    max_error_rate reads a served (or stream) cell's failed requests over the requests it sent, with the
    95% Clopper-Pearson interval of that proportion (scipy's binomtest): it fails when the interval lies
    wholly above the bound (0 allows none: one failed request fails it), like the speed bounds; a cell
    that counted no requests (not ok) fails as "cannot judge", an offline cell passes (no requests to fail).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from orchestrator.matrix.baselines import CONFIG_AXES, INT_AXES, axis_value
from orchestrator.judge.logits import VERDICTS
from orchestrator.judge.speed import PAIRED
from orchestrator.matrix.cells import load_label
from orchestrator.matrix.models import AXES, MatrixError
from orchestrator.matrix.validate import pydantic_problems
from orchestrator.store.schema import json_object
from orchestrator.values import finite, shown

# bound -> (the cross-run column it reads, what it says)
SPEED_BOUNDS = {"max_slowdown": ("tok_s", "output tokens/s"), "max_ttft_p99_increase": ("ttft_p99", "TTFT p99"),
                "max_memory_increase": ("mem", "peak memory")}


class PolicyError(MatrixError):
    """All the mistakes found in one policy file, one `path: message` per line (as for a matrix)."""

    def __init__(self, problems: list[str], source: str = "policy"):
        super().__init__(problems, source)


class TaskRule(BaseModel):
    """The task layer: a task's metric on the cell against its baseline (or OLD's cell), item by item."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="The task's name in the matrix's tasks section")
    min_ratio: float | None = Field(None, gt=0, description="Least cell/baseline ratio of the metric (MLPerf's "
                                    "tiers: 0.99, 0.999); fails only when the ratio's 95% interval is wholly below")
    no_regression: bool = Field(False, description="Fail when the paired test finds a regression (p < task_alpha), "
                                "and, as 'cannot judge', when it could not see a change of tolerances.task_tolerance")
    accept_underpowered: bool = Field(False, description="no_regression passes a 'not distinguishable' verdict (the "
                                      "test could not see a change of the tolerance's size) instead of failing it")

    @model_validator(mode="after")
    def _something(self) -> "TaskRule":
        if self.min_ratio is None and not self.no_regression:
            raise ValueError("a task rule needs min_ratio or no_regression: true")
        return self


class SamplingRule(BaseModel):
    """The sampling layer: the cell's seeded samples against its baseline's (or OLD's cell's)."""

    model_config = ConfigDict(extra="forbid")
    identical: bool = Field(False, description="Every sample identical to the baseline's with the same seed")
    same_distribution: bool = Field(False, description="Fail when a distribution test finds a difference "
                                    "(p < sampling_alpha over the tests run); 'not distinguishable' and "
                                    "'sampler differs' cannot pass it unless accepted below")
    accept_underpowered: bool = Field(False, description="same_distribution passes 'not distinguishable' (no test "
                                      "found a difference, but the seeds could not have shown one of "
                                      "tolerances.sampling_shift)")
    accept_sampler_difference: bool = Field(False, description="same_distribution passes 'sampler differs' (the "
                                            "served distributions differ because the engines' samplers do, the "
                                            "model test finds no difference)")

    @model_validator(mode="after")
    def _something(self) -> "SamplingRule":
        if not (self.identical or self.same_distribution):
            raise ValueError("a sampling rule needs identical: true or same_distribution: true")
        return self

    def label(self) -> str:
        return "sampling " + " ".join(k for k in ("identical", "same_distribution") if getattr(self, k))


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid")
    match: dict[str, Any] = Field(default_factory=dict, description="Axis values (a list: any of them, each required)")
    must_be: Literal["identical", "lossless", "near-lossless"] | None = None
    max_slowdown: float | None = Field(None, ge=0, lt=1, description="--against, or an env pair (match: {env: ...}): "
                                       "most output tokens/s may drop")
    max_ttft_p99_increase: float | None = Field(None, ge=0, description="--against: most TTFT p99 may rise")
    max_memory_increase: float | None = Field(None, ge=0, description="--against: most peak memory may rise")
    require_run_noise: bool = Field(False, description="--against: a speed bound fails as 'cannot judge' where no "
                                    "run-to-run noise estimate exists (no --noise-run, no earlier runs under "
                                    "--history); by default such a bound is not checked, and says so")
    task: TaskRule | None = None
    sampling: SamplingRule | None = None
    max_error_rate: float | None = Field(None, ge=0, lt=1, description="Served and stream cells: most failed "
                                         "requests / requests sent; fails when the proportion's 95% interval is "
                                         "wholly above (0: no failed request at all)")

    @model_validator(mode="after")
    def _something(self) -> "Rule":
        if self.must_be is None and not self.speed_bounds() and self.task is None and self.sampling is None \
                and self.max_error_rate is None:
            raise ValueError("a rule needs must_be, a bound (max_slowdown, max_ttft_p99_increase, "
                             "max_memory_increase, max_error_rate), a task rule or a sampling rule")
        return self

    def speed_bounds(self) -> dict[str, float]:
        return {k: v for k in SPEED_BOUNDS if (v := getattr(self, k)) is not None}

    @field_validator("match")
    @classmethod
    def _axis_values(cls, v: dict) -> dict:
        unknown = sorted(set(v) - set(AXES))
        if unknown:
            raise ValueError(f"unknown axis {', '.join(map(repr, unknown))} (known: {', '.join(AXES)})")
        for axis, value in v.items():
            values = value if isinstance(value, list) else [value]
            if not values:
                raise ValueError(f"{axis}: an empty list matches nothing")
            for x in values:
                if axis == "request_rate":
                    ok, want = isinstance(x, (int, float)) and not isinstance(x, bool), "a number"
                elif axis in INT_AXES:
                    ok, want = isinstance(x, int) and not isinstance(x, bool), "an integer"
                else:
                    ok, want = isinstance(x, str), "a string"
                if not ok:
                    raise ValueError(f"{axis}: expected {want}, got {shown(x)}")
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
        raise PolicyError(pydantic_problems(err, model=Policy), str(path)) from None


@dataclass
class Check:
    """One rule against one cell (or a combination of a rule's values that no cell has): a JUnit test case."""

    rule: int
    name: str          # e.g. "must_be lossless", "max_slowdown 0.05"
    cell: str          # the cell's label, or "(no cell)"
    cell_id: str | None
    passed: bool
    message: str


def _where(r: dict) -> str:
    env = f" env {r['env']}" if isinstance(r.get("env"), str) else ""
    return "/".join(str(r[a]) for a in CONFIG_AXES if r[a] != "offline") + env + " " + (
        load_label(r["mode"], r["batch_size"], r["request_rate"], r.get("load"))
        if r["mode"] in ("serve", "stream") else f"batch={r['batch_size']}")


def _speed_check(r: dict, bound: str, limit: float, require_run_noise: bool) -> tuple[bool, str]:
    col, what = SPEED_BOUNDS[bound]
    if col == "mem":
        ratio = r.get("mem_ratio")
        if not finite(ratio):
            return False, f"cannot judge {what}: no ratio (not measured on a side, or not ok)"
        ok = ratio <= 1 + limit
        return ok, f"{what} x{ratio:.3f} (one peak per cell, no interval) {'<=' if ok else '>'} x{1 + limit:.3f}"
    ratio, lo, hi = r.get(f"{col}_ratio"), r.get(f"{col}_lo"), r.get(f"{col}_hi")
    if not (finite(lo) and finite(hi)):
        return False, f"cannot judge {what}: no interval (needs 2+ repeats on both sides)"
    run_sd = r.get(f"{col}_run_sd")
    noise = f", run drift sd {100 * run_sd:.1f}%" if finite(run_sd) else ", repeats only"
    lo, hi, band = _family_band(r, col, lo, hi)
    shown = f"{what} x{ratio:.3f} [95% CI {r[f'{col}_lo']:.3f}, {r[f'{col}_hi']:.3f}{band}] (n {r.get(f'{col}_n')}{noise})"
    if not isinstance(r.get("run_noise"), str):   # a busy host's run is no regression: the repeats cannot tell
        return not require_run_noise, (f"cannot judge {what} across runs (no run-to-run noise estimate: --noise-run "
                                       f"or earlier runs under --history): {shown}; " +
                                       ("require_run_noise fails it" if require_run_noise else
                                        "not checked (require_run_noise: true would fail it)"))
    if bound == "max_slowdown":   # worse is lower: fail only if even the interval's top is below the bound
        ok = hi >= 1 - limit
        return ok, f"{shown}: " + (f"wholly below x{1 - limit:.3f}" if not ok else f"above x{1 - limit:.3f}"
                                   if lo >= 1 - limit else f"not wholly below x{1 - limit:.3f} (within the noise)")
    ok = lo <= 1 + limit
    return ok, f"{shown}: " + (f"wholly above x{1 + limit:.3f}" if not ok else f"below x{1 + limit:.3f}"
                               if hi <= 1 + limit else f"not wholly above x{1 + limit:.3f} (within the noise)")


def _family_band(r: dict, col: str, lo: float, hi: float) -> tuple[float, float, str]:
    """(lo, hi, how it is shown) of the interval a bound is judged by: the one at the speed family's level
    (`{col}_band_lo/hi`, orchestrator/judge/speed.py family_calls), so that a gate's many bounds over a matrix fail
    no more often by chance than the run's speed calls are wrong; the 95% interval where the band is missing."""
    b_lo, b_hi = r.get(f"{col}_band_lo"), r.get(f"{col}_band_hi")
    if not (finite(b_lo) and finite(b_hi)):
        return lo, hi, ""
    return b_lo, b_hi, f"; at the family's level {b_lo:.3f}, {b_hi:.3f}"


def _env_speed_check(r: dict, bound: str, limit: float) -> tuple[bool, str]:
    """A speed bound within one run: a cell paired with its baseline (an env pair, or measure.paired_timing's turns:
    in one engine, or beside a timing twin; orchestrator/judge/speed.py: their repeats took turns, so the paired
    interval holds the host's drift); other cells cannot be judged."""
    what = SPEED_BOUNDS[bound][1]
    if r.get("speed_test") != PAIRED:
        return False, (f"cannot judge {what} within one run: its repeats did not take turns with its baseline's "
                       "(an env pair, or measure.paired_timing; else compare with a stored run: --against OLD_RUN)")
    if bound != "max_slowdown":
        return False, f"cannot judge {what} within one run: an env pair bounds output tokens/s only (max_slowdown)"
    ratio = r["speedup"]
    lo, hi, band = _family_band(r, "speedup", r["speedup_lo"], r["speedup_hi"])
    side = f"env {r.get('env')} over its baseline's" if isinstance(r.get("env"), str) else "over its baseline's turns"
    shown = (f"{what} x{ratio:.3f} [95% CI {r['speedup_lo']:.3f}, {r['speedup_hi']:.3f}{band}] "
             f"(n {int(r['speedup_n_cell'])} pairs, paired t, {side})")
    ok = hi >= 1 - limit
    return ok, f"{shown}: " + (f"wholly below x{1 - limit:.3f}" if not ok else f"above x{1 - limit:.3f}"
                               if lo >= 1 - limit else f"not wholly below x{1 - limit:.3f} (within the noise)")


def error_interval(errors: int, sent: int, level: float = 0.95) -> tuple[float, float]:
    """The Clopper-Pearson (exact) interval of a proportion errors / sent, from scipy."""
    from scipy.stats import binomtest

    ci = binomtest(errors, sent).proportion_ci(level, method="exact")
    return float(ci.low), float(ci.high)


def _error_check(r: dict, limit: float) -> tuple[bool, str]:
    if (r.get("mode") or "offline") == "offline":
        return True, "offline cell: no requests to fail"
    errors, sent = r.get("errors"), r.get("requests_sent")
    if r.get("status") != "ok" or not finite(errors) or not finite(sent) or sent <= 0:
        return False, f"cannot judge the error rate: no requests counted (status {r.get('status')})"
    errors, sent = int(errors), int(sent)
    lo, hi = error_interval(errors, sent)
    kinds = json_object(r.get("errors_by_kind"))
    shown = (f"errors {errors}/{sent} = {errors / sent:.2%} [95% CI {lo:.2%}, {hi:.2%}]"
             + (f" ({', '.join(f'{k} {n}' for k, n in kinds.items())})" if kinds else ""))
    ok = lo <= limit if limit > 0 else errors == 0
    return ok, f"{shown}: " + (("within noise of " if hi > limit else "below ") if ok else "wholly above ") + f"{limit:.2%}"


def _task_check(tv: pd.DataFrame | None, cell_id: str, rule: TaskRule) -> tuple[bool, str]:
    hit = None if tv is None or tv.empty else tv[(tv.cell_id == cell_id) & (tv.task == rule.name)]
    if hit is None or hit.empty:
        return False, f"cannot judge task {rule.name}: the cell has no rows for it"
    r = hit.iloc[0].to_dict()
    if r["task_verdict"] == "n/a":
        return False, f"cannot judge task {rule.name}: {r['task_reason']}"
    if rule.no_regression and r["task_verdict"] == "not distinguishable" and not rule.accept_underpowered:
        return False, (f"cannot judge task {rule.name}: not distinguishable ({r['task_reason']}); "
                       "accept_underpowered: true accepts it")
    fails = []
    if rule.no_regression and r["task_verdict"] == "regressed":
        fails.append("a significant regression")
    bound = ""
    if rule.min_ratio is not None:
        if not (finite(r.get("ratio_lo")) and finite(r.get("ratio_hi"))):
            return False, f"cannot judge task {rule.name}: no ratio (the baseline's {r['metric']} is 0)"
        below = r["ratio_hi"] < rule.min_ratio   # even the interval's top is below the bound
        if below:
            fails.append(f"ratio wholly below x{rule.min_ratio:g}")
        bound = (f"ratio x{r['ratio']:.4f} [95% CI {r['ratio_lo']:.4f}, {r['ratio_hi']:.4f}] "
                 + ("wholly below" if below else "within noise of" if r["ratio_lo"] < rule.min_ratio else "above")
                 + f" x{rule.min_ratio:g}; ")
    return not fails, f"task {rule.name}: {bound}{r['task_verdict']}: {r['task_reason']}"


def _sampling_check(sv: pd.DataFrame | None, cell_id: str, rule: SamplingRule) -> tuple[bool, str]:
    hit = None if sv is None or sv.empty else sv[sv.cell_id == cell_id]
    if hit is None or hit.empty:
        return False, "cannot judge sampling: the cell has no samples"
    r = hit.iloc[0].to_dict()
    if r.get("sampling_verdict", "n/a") == "n/a" or (rule.same_distribution and r.get("dist_verdict") == "n/a"):
        return False, f"cannot judge sampling: {r.get('sampling_reason')}"
    fails = []
    if rule.identical and r.get("seed_verdict") != "identical":
        fails.append("not identical seed by seed" if r.get("seed_verdict") == "differs" else
                     "identity not promised against this baseline")
    dist = r.get("dist_verdict")
    if rule.same_distribution and dist == "not distinguishable" and not rule.accept_underpowered:
        return False, (f"cannot judge sampling: not distinguishable ({r['sampling_reason']}); "
                       "accept_underpowered: true accepts it")
    if rule.same_distribution and dist == "different":
        fails.append("a different distribution")
    if rule.same_distribution and dist == "sampler differs" and not rule.accept_sampler_difference:
        fails.append("another served distribution, from another sampler (accept_sampler_difference: true "
                     "accepts it)")
    return not fails, ("; ".join(fails) + ": " if fails else "") + f"{r['sampling_verdict']}: {r['sampling_reason']}"


def evaluate(df: pd.DataFrame, policy: Policy, against: bool, tasks: pd.DataFrame | None = None,
             sampling: pd.DataFrame | None = None) -> list[Check]:
    """Every (rule, cell) check. Speed bounds need `against` (a cross-run frame); task rules read `tasks`
    (orchestrator/judge/task_verdicts.py), sampling rules `sampling` (orchestrator/judge/sampling_verdicts.py), both of
    the same comparison."""
    _check_against_run(df, policy, tasks)
    checks: list[Check] = []
    rank = {v: i for i, v in enumerate(VERDICTS)}
    for i, rule in enumerate(policy.rules):
        if rule.speed_bounds() and not against and "env" not in rule.match:
            envs = "env" in df and df["env"].notna().any()   # a run with env pairs: they are bounded within it
            raise PolicyError([f"rules[{i}]: {', '.join(rule.speed_bounds())} compare with a stored run: "
                               "give --against OLD_RUN" + (" (or match the env of an env pair: match: {env: NAME})"
                                                          if envs else "")])
        wants = {a: [axis_value(a, x) for x in (v if isinstance(v, list) else [v])] for a, v in rule.match.items()}
        have = list(zip(*[[axis_value(a, x) for x in df[a]] for a in wants])) if wants else [()] * len(df)
        hit = np.array([all(h in w for h, w in zip(row, wants.values())) for row in have], dtype=bool)
        task_name = None
        if rule.task:
            task_name = f"task {rule.task.name}" + (f" min_ratio {rule.task.min_ratio:g}" if rule.task.min_ratio
                                                     else "") + (" no_regression" if rule.task.no_regression else "")
        names = ([f"must_be {rule.must_be}"] if rule.must_be else []) + [f"{k} {v:g}" for k, v in
                                                                        rule.speed_bounds().items()] + \
            ([task_name] if task_name else []) + ([rule.sampling.label()] if rule.sampling else []) + \
            ([f"max_error_rate {rule.max_error_rate:g}"] if rule.max_error_rate is not None else [])
        present = {row for row, h in zip(have, hit) if h}
        for combo in itertools.product(*wants.values()):  # every value a rule lists must have been run
            if combo not in present:
                named = ", ".join(f"{a}={c}" for a, c in zip(wants, combo)) or "any axis values"
                checks.append(Check(i, " + ".join(names), "(no cell)", None, False, f"no cell for {named}"))
        for r in df[hit].to_dict("records"):
            cell = _where(r)
            if rule.must_be:
                ok = r["verdict"] != "n/a" and rank[r["verdict"]] <= rank[rule.must_be]
                checks.append(Check(i, f"must_be {rule.must_be}", cell, r["cell_id"], ok,
                                    f"{r['verdict']}: {r['verdict_reason']}"))
            for bound, limit in rule.speed_bounds().items():
                if r.get("only_in"):
                    ok, msg = False, r["verdict_reason"]
                elif not against:   # an env pair, within one run
                    ok, msg = _env_speed_check(r, bound, limit)
                else:
                    ok, msg = _speed_check(r, bound, limit, rule.require_run_noise)
                checks.append(Check(i, f"{bound} {limit:g}", cell, r["cell_id"], ok, msg))
            if rule.task:
                ok, msg = (False, r["verdict_reason"]) if r.get("only_in") else _task_check(tasks, r["cell_id"], rule.task)
                checks.append(Check(i, task_name, cell, r["cell_id"], ok, msg))
            if rule.sampling:
                ok, msg = (False, r["verdict_reason"]) if r.get("only_in") else _sampling_check(sampling, r["cell_id"],
                                                                                         rule.sampling)
                checks.append(Check(i, rule.sampling.label(), cell, r["cell_id"], ok, msg))
            if rule.max_error_rate is not None:
                ok, msg = (False, r["verdict_reason"]) if r.get("only_in") else _error_check(r, rule.max_error_rate)
                checks.append(Check(i, f"max_error_rate {rule.max_error_rate:g}", cell, r["cell_id"], ok, msg))
    return checks


def _check_against_run(df: pd.DataFrame, policy: Policy, tasks: pd.DataFrame | None) -> None:
    """A rule that names an axis value no cell of the run has, or a task the run did not run, is a
    mistake in the policy (exit 2, with what the run has), not a cell that failed."""
    problems = []
    for i, rule in enumerate(policy.rules):
        for axis, value in rule.match.items():
            have = sorted({axis_value(axis, x) for x in df[axis]}, key=str)
            for x in value if isinstance(value, list) else [value]:
                if axis_value(axis, x) not in have:
                    problems.append(f"rules[{i}].match.{axis}: no cell of the run has {shown(x)} "
                                    f"(it has: {', '.join(map(str, have)) or 'no cells'})")
        if rule.task and tasks is not None:
            names = sorted(set(tasks.task)) if len(tasks) else []
            if rule.task.name not in names:
                problems.append(f"rules[{i}].task.name: the run has no task {shown(rule.task.name)} "
                                f"(it has: {', '.join(names) or 'none'})")
    if problems:
        raise PolicyError(problems)


def check_line(c: Check) -> str:
    return f"rule {c.rule} ({c.name}): " + (f"{c.cell_id} {c.cell}: " if c.cell_id else "") + c.message


def gate(df: pd.DataFrame, policy: Policy, against: bool = False) -> tuple[bool, list[str]]:
    """(True, []) when every check passes; else one line per failed check."""
    failed = [c for c in evaluate(df, policy, against) if not c.passed]
    return not failed, [check_line(c) for c in failed]
