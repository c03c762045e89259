"""Matrix -> cells -> engine groups.

A cell is one point of the matrix; its id is a hash of its canonical config, so the same cell has
the same id in every run (that is what makes resume work). Cells that differ only in batch size,
lengths or request rate share an engine key, and so one engine load (or one server start).

Axes that do not apply are not axes of a cell: an offline cell has no request rate, a model with an
endpoint has no offline cells, and a flag set a framework does not define is not a cell of it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field
from typing import Any

from adapters.base import normalize_quantization
from adapters.contract.arrivals import RATED
from orchestrator.matrix.models import AXES, Matrix, MatrixError, RecipeRef, SyntheticWorkload, axis_values, stable_dump
from orchestrator.matrix.recipes import quant_label


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
    mode: str = "offline"
    request_rate: float | None = None      # serve cells: requests/s (inf: closed loop); stream cells: their
                                           # arrival rate; offline, search, a stream at once: None
    search: bool = False                   # a serve cell whose load is searched (serve.search)
    workload: str | None = None            # the named workload it runs (None: the matrix's single workload section)
    env: str | None = None                 # the named engine environment (matrix envs; None: no env axis)
    cell_id: str = ""
    engine_key: str = ""
    level: str | None = None               # the level the engine loads where `quantization` is a recipe's short form

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
    mode: str = "offline"
    env: str | None = None
    level: str | None = None               # a recipe's base level (quantization is then recipe-<name>)

    @property
    def engine_quantization(self) -> str:
        """What the engine loads: the recipe's base level (its overrides are in options), else the quantization."""
        return self.level or self.quantization


def _recipe(fw: str, ref: RecipeRef, options: dict) -> tuple[dict, dict]:
    """A recipe cell's options (its tensor_types, where the engine has that option) and what its id holds."""
    if ref.digest is None or ref.tensor_types is None:
        raise MatrixError([f"axes.quantization: the recipe {ref.recipe!r} was not read (a matrix naming a recipe "
                           "is loaded from its file: bench run/validate MATRIX.yaml)"])
    from adapters import ADAPTERS

    if "tensor_types" in ADAPTERS[fw].Options.model_fields:
        options = {**options, "tensor_types": dict(ref.tensor_types)}
    if ref.imatrix and "imatrix" in ADAPTERS[fw].Options.model_fields:   # the file's sha256 is in the recipe's
        options = {**options, "imatrix": ref.imatrix}
    return options, {"base": ref.base, "sha256": ref.digest}


def _make_cell(m: Matrix, values: dict[str, Any]) -> Cell:
    fw = values["framework"]
    options = m.engine_options(fw, values["flags"])
    quant, ref = quant_label(values["quantization"]), values["quantization"]
    recipe = None
    if isinstance(ref, RecipeRef):   # the recipe's file digest is in the id: an edited file is another cell
        options, recipe = _recipe(fw, ref, options)
    model = m.model_entry(values["model"])
    # the serving fields are left out where unset, so ids of cells without them stay as they were
    entry = model.model_dump(exclude={k for k in ("endpoint", "api_key_env") if getattr(model, k) is None})
    engine = {"framework": fw, "model": entry, "quantization": quant, "flags": values["flags"], "options": options}
    if recipe:
        engine["recipe"] = recipe
    if values["env"] is not None:   # an engine environment: its own engine (ids without the env axis stay as they were)
        engine["env"] = values["env"]
    serve = values["mode"] == "serve"
    if values["mode"] != "offline":  # only other modes name theirs, so offline ids stay what they were before modes
        engine["mode"] = values["mode"]
    if values["mode"] == "stream":   # the engine's own cap on running requests is set at load
        engine["max_running"] = values["batch_size"]
    canonical = engine | {a: values[a] for a in ("batch_size", "input_len", "output_len")} | {
        "workload": stable_dump(m.workload_of(values["workload"])), "measure": stable_dump(m.measure)}
    if values["workload"] is not None:   # a named workload: its name too (a single section's ids stay as they were)
        canonical["workload_name"] = values["workload"]
    override = m.sampling_override(fw, values["flags"])
    if override:   # a sampler change is its own cell (ids of flag sets without one stay as they were)
        canonical["sampling_override"] = override
    search = serve and m.serve.search is not None
    if serve:
        canonical |= {"request_rate": values["request_rate"], "serve": serve_settings(m)}
    schedule = stream_schedule(m, values["workload"], values["request_rate"]) if values["mode"] == "stream" else None
    if schedule:   # a stream on an arrival schedule (ids of streams submitted at once stay as they were)
        canonical |= {"request_rate": values["request_rate"], "arrival": schedule if schedule == "trace"
                      else stable_dump(m.serve.arrival)}
    return Cell(framework=fw, model=values["model"], quantization=quant, flags=values["flags"],
                batch_size=values["batch_size"], input_len=values["input_len"],
                output_len=values["output_len"], options=options, mode=values["mode"],
                request_rate=float(values["request_rate"]) if values["request_rate"] is not None else None,
                search=search,
                workload=values["workload"], env=values["env"], cell_id=_hash(canonical), engine_key=_hash(engine),
                level=recipe["base"] if recipe else None)


def serve_settings(m: Matrix) -> dict[str, Any]:
    """The serve section as it enters a serve cell's id: keys added later are left out where unset, so
    the ids of cells that do not use them stay as they were."""
    out = m.serve.model_dump(exclude={k for k in ("slo_e2e_ms", "search") if getattr(m.serve, k) is None})
    if m.serve.arrival.kind in ("constant", "poisson"):
        out["arrival"] = m.serve.arrival.kind   # their plain names, as before the shapes were typed
    return out


def _applies(m: Matrix, point: dict[str, Any]) -> tuple[str, str] | None:
    """(axis, why) where an axis combination is not a cell, None where it is one."""
    if point["flags"] not in m.flag_sets(point["framework"]):
        return "flags", (f"flag set '{point['flags']}' is not defined for {point['framework']} "
                         f"(defined: {', '.join(m.flag_sets(point['framework']))})")
    if point["mode"] != "serve" and m.model_entry(point["model"]).endpoint:
        return "mode", f"model '{point['model']}' has an endpoint, so it makes serve cells only"
    return None


def _point(m: Matrix, values: dict[str, Any]) -> dict[str, Any]:
    if values["mode"] == "stream":
        # the rate stays only where it sets the arrivals (serve.arrival's shape); at once, a ramp or a trace: None
        if stream_schedule(m, values["workload"], values["request_rate"]) not in RATED:
            values["request_rate"] = None
    elif values["mode"] == "offline":
        values["request_rate"] = None  # a static batch has no arrival rate
    elif m.serve.search is not None:
        values["request_rate"] = None  # the search chooses it
        if m.serve.search.variable == "concurrency":   # and the concurrency: one search per configuration
            values["batch_size"] = int(m.serve.search.high)
    elif own_schedule(m, values["workload"]):
        values["request_rate"] = None  # a ramp's rates, or a trace's times
    w = m.workload_of(values["workload"])
    if isinstance(w, SyntheticWorkload):   # drawn lengths: the row names their mean
        for axis, dist in (("input_len", w.input_lengths), ("output_len", w.output_lengths)):
            if dist is not None:
                values[axis] = dist.nominal
    return values


def matches(values: dict[str, Any], rule: dict[str, Any]) -> bool:
    """A rule matches when every key it names equals the value (or is in the list it gives)."""
    for key, want in rule.items():
        wants = want if isinstance(want, list) else [want]
        have = values.get(key)
        if key == "quantization":
            wants, have = [quant_label(w) if isinstance(w, RecipeRef) else normalize_quantization(str(w))
                           for w in wants], quant_label(have)
        if have not in wants:
            return False
    return True


def expand(m: Matrix) -> list[Cell]:
    """Every axis combination, minus `exclude`, plus `include`, in a stable order without duplicates."""
    combos = []
    for values in itertools.product(*(axis_values(m, a) for a in AXES)):
        point = _point(m, dict(zip(AXES, values)))
        if _applies(m, point) or any(matches(point, rule) for rule in m.exclude):
            continue
        combos.append(point)
    problems = []
    recipes = {q.label: q for q in m.axes.quantization if isinstance(q, RecipeRef)}
    for i, rule in enumerate(m.include):
        point = _point(m, {a: rule.get(a, axis_values(m, a)[0]) for a in AXES})
        if isinstance(point["quantization"], str) and point["quantization"] in recipes:   # a recipe by its short form
            point["quantization"] = recipes[point["quantization"]]
        why = _applies(m, point)
        if why:
            problems.append(f"include[{i}].{why[0]}: {why[1]}")
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


def own_schedule(m: Matrix, workload: str | None) -> str | None:
    """The arrival kind of serve cells whose schedule is not set by request_rate: 'trace' (a trace workload's
    times) or 'ramp' (serve.arrival's own rates); None where request_rate sets it."""
    if m.workload_of(workload).kind == "trace":
        return "trace"
    return "ramp" if m.serve.arrival.kind == "ramp" else None


def stream_schedule(m: Matrix, workload: str | None, request_rate: float | None) -> str | None:
    """How a stream cell's timed requests arrive: a trace's times ('trace'), a ramp's rates ('ramp'),
    serve.arrival's shape at a finite request rate ('constant', 'poisson', 'gamma'); None: all at once."""
    own = own_schedule(m, workload)
    if own:
        return own
    return m.serve.arrival.kind if request_rate is not None and not math.isinf(request_rate) else None


def load_label(mode: str | None, batch_size: int, request_rate: float | None, arrival: str | None = None) -> str:
    """How a cell's load reads in tables: 'batch 4' offline, 'c=4' a served closed loop of 4, and
    'poisson 8/s, c<=4' requests arriving at 8/s with at most 4 in flight; 'stream c<=4' a stream with at most
    4 running; 'search rate, c<=4' an SLO search (its row's rate: the maximum found); 'ramp, c<=4' and
    'trace, c<=4' arrivals on a schedule of their own; 'stream, poisson 8/s, c<=4' or 'stream, trace, c<=4' a stream
    whose requests arrive so."""
    if mode == "stream":
        if arrival in ("ramp", "trace"):
            return f"stream, {arrival}, c<={batch_size}"
        if request_rate is not None and request_rate == request_rate and request_rate != float("inf"):
            return f"stream, {arrival or 'rate'} {request_rate:g}/s, c<={batch_size}"
        return f"stream c<={batch_size}"
    if mode != "serve":
        return f"batch {batch_size}"
    if arrival in ("search rate", "search concurrency", "ramp", "trace"):
        return f"{arrival}, c<={batch_size}"
    if request_rate is None or request_rate != request_rate or request_rate == float("inf"):
        return f"c={batch_size}"
    return f"{arrival or 'rate'} {request_rate:g}/s, c<={batch_size}"


def group(cells: list[Cell]) -> list[EngineGroup]:
    groups: dict[str, EngineGroup] = {}
    for c in cells:
        g = groups.get(c.engine_key)
        if g is None:
            g = groups[c.engine_key] = EngineGroup(c.engine_key, c.framework, c.model, c.quantization,
                                                   c.flags, c.options, [], c.mode, c.env, c.level)
        g.cells.append(c)
    for g in groups.values():
        # small batches first: a crash at a large batch then leaves the small ones measured
        g.cells.sort(key=lambda c: (c.batch_size, c.request_rate or 0, c.input_len, c.output_len))
    return list(groups.values())


def pair_key(cell: Cell) -> tuple:
    """What a cell is but for its env: cells with the same key in two envs are a pair (run interleaved)."""
    return (cell.framework, cell.model, cell.quantization, cell.flags, cell.batch_size, cell.input_len,
            cell.output_len, cell.mode, cell.request_rate, cell.search, cell.workload)
