"""Which cell each cell is judged against: axis values in comparable form, the baseline selector and
the tolerances from the CLI, each cell's baseline, and the noise pairs of each engine.

Baseline: the selector's axes are fixed, the others are the cell's own. Without such a cell at the
cell's batch size and lengths, the baseline config's batch-1 cell is used, else its smallest batch
(of the cell's own workload first); `baseline_match` says "exact" or which fallback. The baseline
cell is compared with itself. parse_tolerances(text, base) overrides fields of `base` (the defaults
when None).

Noise pairs, per engine_key: run-to-run (rr: its batch-1, else smallest-batch, cell's repeat 0 vs 1)
and batch invariance (bi: that cell vs the largest-batch cell).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import pandas as pd
from pydantic import ValidationError

from adapters.base import normalize_quantization
from orchestrator.matrix.models import AXES, Tolerances
from orchestrator.matrix.validate import pydantic_problems

CONFIG_AXES = ("framework", "model", "quantization", "flags", "mode")
# what a baseline must match besides: the engine environment (matrix envs; None without the env axis)
BASELINE_AXES = (*CONFIG_AXES, "env")


INT_AXES = ("batch_size", "input_len", "output_len")


# where no baseline cell matches, these may fall back (every workload scores the same prompts; the
# fallback is named in baseline_match, since its speed is another workload's)
LOAD_AXES = (*INT_AXES, "request_rate", "workload")


@functools.lru_cache(maxsize=1 << 16, typed=True)   # called per cell and axis (1.6M calls at 100k cells)
def axis_value(axis: str, v: Any) -> Any:
    """Comparable form of an axis value (quantization aliases, ints from YAML or the CLI)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):   # pandas reads a null as NaN
        return None
    if axis == "quantization":
        return normalize_quantization(str(v))
    if axis == "request_rate":
        return float(v)
    return int(v) if axis in INT_AXES else str(v)


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
            out[key] = axis_value(key, value) if key in LOAD_AXES else value
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
        raise ValueError("tolerances: " + "; ".join(pydantic_problems(err))) from None


def resolve_baselines(cells: pd.DataFrame, comparable: pd.DataFrame, selector: dict) -> tuple[list, list]:
    """For each cell: the baseline cell_id (or None) and how it was chosen."""
    by_config: dict[tuple, list] = {}
    for c in comparable[[*AXES, "cell_id"]].itertuples(index=False):   # the columns it reads: fast at 100k
        by_config.setdefault(tuple(axis_value(a, getattr(c, a)) for a in BASELINE_AXES), []).append(c)
    sel = {k: axis_value(k, v) for k, v in selector.items()}
    cache: dict[tuple, tuple] = {}
    chosen = []
    for r in cells[list(AXES)].itertuples(index=False):
        want = {a: sel[a] if a in sel else axis_value(a, getattr(r, a)) for a in AXES}
        if want["mode"] != "serve":
            want["request_rate"] = None   # a served cell's offline baseline has no arrival rate
        key = tuple(want.values())
        if key not in cache:
            cache[key] = _pick_baseline(by_config.get(tuple(want[a] for a in BASELINE_AXES), []), want, sel)
        chosen.append(cache[key])
    return [c[0] for c in chosen], [c[1] for c in chosen]


def _pick_baseline(cands: list, want: dict, sel: dict) -> tuple[str | None, str]:
    # axes the selector names are fixed; batch size and lengths may fall back, since every cell
    # scores the same prompts: exact, else batch 1, else the smallest batch (own lengths first)
    cands = [c for c in cands if all(axis_value(a, getattr(c, a)) == sel[a] for a in LOAD_AXES if a in sel)]
    if not cands:
        shown = [a for a in AXES if a in sel or (a in BASELINE_AXES and want[a] not in (None, "offline"))]
        named = ", ".join(f"{a}={want[a]}" for a in shown)
        return None, f"no ok baseline cell with logprobs for {named}"

    def diff(c) -> list[str]:
        return [a for a in LOAD_AXES if axis_value(a, getattr(c, a)) != want[a]]

    best = min(cands, key=lambda c: (bool(diff(c)), "workload" in diff(c),
                                     "input_len" in diff(c) or "output_len" in diff(c), c.batch_size != 1, c.batch_size, c.input_len, c.output_len, c.cell_id))
    if not diff(best):
        return best.cell_id, "exact"
    return best.cell_id, ("fallback: baseline " + ", ".join(f"{a}={getattr(best, a)}" for a in diff(best))
                          + " (none at " + ", ".join(f"{a}={want[a]}" for a in diff(best)) + ")")


def noise_pairs(comparable: pd.DataFrame) -> pd.DataFrame:
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
