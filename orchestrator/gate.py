"""`bench gate`: a policy file of rules (axis values -> the verdict they must reach) checked against
the verdicts of orchestrator/analysis.py.

    bench gate RUN --policy policy.yaml        # exit status 1 when ok is False; print `lines`
        ok, lines = gate(analyse(RUN), load_policy("policy.yaml"))   # PolicyError: print, exit 2

    policy.yaml:
        rules:
          - match: {framework: vllm, quantization: [fp16, bf16]}   # list: each value must be present
            must_be: lossless                                     # identical | lossless | near-lossless
    A matched cell fails when its verdict is worse (or n/a: not ok, no logprobs); so does a listed
    value no cell has.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from orchestrator.analysis import _CONFIG_AXES, _INT_AXES, VERDICTS, _axis_value
from orchestrator.cells import load_label
from orchestrator.matrix import AXES, MatrixError, _pydantic_problems


class PolicyError(MatrixError):
    """All the mistakes found in one policy file, one `path: message` per line (as for a matrix)."""

    def __init__(self, problems: list[str], source: str = "policy"):
        super().__init__(problems, source)


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid")
    match: dict[str, Any] = Field(default_factory=dict, description="Axis values (a list: any of them, each required)")
    must_be: Literal["identical", "lossless", "near-lossless"]

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
                elif axis in _INT_AXES:
                    ok, want = isinstance(x, int) and not isinstance(x, bool), "an integer"
                else:
                    ok, want = isinstance(x, str), "a string"
                if not ok:
                    raise ValueError(f"{axis}: expected {want}, got {x!r}")
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
        have = list(zip(*[[_axis_value(a, x) for x in df[a]] for a in wants])) if wants else [()] * len(df)
        hit = np.array([all(h in w for h, w in zip(row, wants.values())) for row in have], dtype=bool)
        label = f"rule {i} (must_be {rule.must_be})"
        present = {row for row, h in zip(have, hit) if h}
        for combo in itertools.product(*wants.values()):  # every value a rule lists must have been run
            if combo not in present:
                named = ", ".join(f"{a}={c}" for a, c in zip(wants, combo)) or "any axis values"
                lines.append(f"{label}: no cell for {named}")
        for r in df[hit].to_dict("records"):
            if r["verdict"] == "n/a" or rank[r["verdict"]] > rank[rule.must_be]:
                where = "/".join(str(r[a]) for a in _CONFIG_AXES if r[a] != "offline") + " " + (
                    load_label(r["mode"], r["batch_size"], r["request_rate"], r.get("load"))
                    if r["mode"] == "serve" else f"batch={r['batch_size']}")
                lines.append(f"{label}: {r['cell_id']} {where}: {r['verdict']}: {r['reason']}")
    return not lines, lines
