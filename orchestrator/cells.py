"""Matrix -> cells -> engine groups.

A cell is one point of the matrix; its id is a hash of its canonical config, so the same cell has
the same id in every run (that is what makes resume work). Cells that differ only in batch size or
lengths share an engine key, and so one engine load.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from adapters.base import normalize_quantization
from orchestrator.matrix import AXES, Matrix, MatrixError


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Cell:
    framework: str
    model: str
    quantization: str
    flags: str
    batch_size: int
    input_len: int
    output_len: int
    options: dict = field(hash=False, compare=False)
    cell_id: str = ""
    engine_key: str = ""

    def axes(self) -> dict[str, Any]:
        return {a: getattr(self, a) for a in AXES}


@dataclass
class EngineGroup:
    engine_key: str
    framework: str
    model: str
    quantization: str
    flags: str
    options: dict
    cells: list[Cell]


def _make_cell(m: Matrix, values: dict[str, Any]) -> Cell:
    fw = values["framework"]
    options = m.flag_sets(fw)[values["flags"]] or {}
    quant = normalize_quantization(values["quantization"])
    engine = {"framework": fw, "model": m.model_entry(values["model"]).model_dump(),
              "quantization": quant, "flags": values["flags"], "options": options}
    canonical = engine | {a: values[a] for a in ("batch_size", "input_len", "output_len")} | {
        "workload": m.workload.model_dump(), "measure": m.measure.model_dump()}
    return Cell(framework=fw, model=values["model"], quantization=quant, flags=values["flags"],
                batch_size=values["batch_size"], input_len=values["input_len"],
                output_len=values["output_len"], options=options,
                cell_id=_hash(canonical), engine_key=_hash(engine))


def matches(values: dict[str, Any], rule: dict[str, Any]) -> bool:
    """A rule matches when every key it names equals the value (or is in the list it gives)."""
    for key, want in rule.items():
        wants = want if isinstance(want, list) else [want]
        have = values.get(key)
        if key == "quantization":
            wants, have = [normalize_quantization(str(w)) for w in wants], normalize_quantization(str(have))
        if have not in wants:
            return False
    return True


def expand(m: Matrix) -> list[Cell]:
    """Every axis combination, minus `exclude`, plus `include`, in a stable order without duplicates."""
    axes = m.axes
    combos = []
    for values in itertools.product(*(getattr(axes, a) for a in AXES)):
        point = dict(zip(AXES, values))
        # flag sets are named per framework: a set a framework does not define is not a cell of it
        if point["flags"] not in m.flag_sets(point["framework"]):
            continue
        if any(matches(point, rule) for rule in m.exclude):
            continue
        combos.append(point)
    problems = []
    for i, rule in enumerate(m.include):
        point = {a: rule.get(a, getattr(axes, a)[0]) for a in AXES}
        if point["flags"] not in m.flag_sets(point["framework"]):
            problems.append(f"include[{i}].flags: flag set '{point['flags']}' is not defined for "
                            f"{point['framework']} (defined: {', '.join(m.flag_sets(point['framework']))})")
            continue
        combos.append(point)
    if problems:
        raise MatrixError(problems)
    cells, seen = [], set()
    for point in combos:
        cell = _make_cell(m, point)
        if cell.cell_id not in seen:
            seen.add(cell.cell_id)
            cells.append(cell)
    if not cells:
        raise MatrixError(["axes: the matrix expands to no cells (check exclude rules and flag sets)"])
    return cells


def group(cells: list[Cell]) -> list[EngineGroup]:
    groups: dict[str, EngineGroup] = {}
    for c in cells:
        g = groups.get(c.engine_key)
        if g is None:
            g = groups[c.engine_key] = EngineGroup(c.engine_key, c.framework, c.model, c.quantization,
                                                   c.flags, c.options, [])
        g.cells.append(c)
    for g in groups.values():
        # small batches first: a crash at a large batch then leaves the small ones measured
        g.cells.sort(key=lambda c: (c.batch_size, c.input_len, c.output_len))
    return list(groups.values())
