"""The matrix YAML read and checked: every mistake collected with its YAML path and the valid choices,
and raised together as one `MatrixError` before any engine starts.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError

from adapters import ADAPTERS
from adapters.contract.arrivals import MatrixArrival
from adapters.base import QUANTIZATIONS, normalize_quantization
from orchestrator.inputs import chat, datasets, hf_datasets, task_sets, traces
from orchestrator.matrix.models import (
    AXES,
    RecipeRef,
    DEFAULT_FLAGS,
    MODES,
    SAMPLING_OVERRIDE,
    HfWorkload,
    Matrix,
    MatrixError,
    Sampling,
    SyntheticWorkload,
    TraceWorkload,
    Workload,
    axis_values,
)
from orchestrator.matrix.paths import local_path_problems
from orchestrator.matrix.yamltext import load_yaml, read_text
from orchestrator.values import shown

def _kinds(union) -> tuple[str, ...]:
    """Every kind (the discriminator's values) of an annotated union: a kind added there is known here."""
    return tuple(k for cls in get_args(get_args(union)[0]) for k in get_args(cls.model_fields["kind"].annotation))


_WORKLOAD_KINDS, _ARRIVAL_KINDS = _kinds(Workload), _kinds(MatrixArrival)


def _path(loc: tuple) -> str:
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _WORKLOAD_KINDS and (out.endswith("workload") or (i == 2 and loc[0] == "workloads")):
            continue  # the discriminator tag pydantic adds is not part of the YAML path
        elif part in _ARRIVAL_KINDS and out == "serve.arrival":
            continue  # nor is serve.arrival's
        elif out.startswith("tasks[") and (part in ("str", "generation", "choice", "lm_eval")
                                            or str(part).startswith("tagged-union[")):
            continue  # nor are a task entry's branches (a built-in name, or a mapping of a kind)
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _models_in(tp: Any) -> list[type[BaseModel]]:
    """The pydantic models a field's annotation can hold (through Optional, lists, dicts, Annotated)."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return [m for arg in get_args(tp) for m in _models_in(arg)]


def known_keys(model: type[BaseModel] | None, loc: tuple) -> list[str] | None:
    """The keys the mapping at `loc` (an error's location, without its last key) may hold, where one
    model is there to say; None where it cannot be told (a union of several, a free-form mapping)."""
    cls, free_key, branches = model, False, []
    for part in loc:
        if cls is None:
            # a union told apart by `kind`: pydantic's tag names the branch the YAML took
            tagged = [m for m in branches if "kind" in m.model_fields and part in get_args(m.model_fields["kind"].annotation)]
            if len(tagged) != 1:
                return None
            cls, branches = tagged[0], []
            continue
        if free_key or isinstance(part, int) or part == cls.__name__:
            free_key = False
            continue   # a mapping's own key, a list index, or pydantic's tag of a union's branch
        if part not in cls.model_fields:
            return None
        annotation = cls.model_fields[part].annotation
        models = _models_in(annotation)
        cls, free_key = (models[0] if len(models) == 1 else None), get_origin(annotation) is dict
        branches = models if cls is None else []
    return list(cls.model_fields) if cls is not None else None


def pydantic_problems(err: ValidationError, prefix: str = "", model: type[BaseModel] | None = None) -> list[str]:
    """`path: message` per error; an unknown key lists the keys that would be valid, where `model` (the
    validated model) says which."""
    problems = []
    for e in err.errors():
        loc = tuple(e["loc"])
        if len(loc) >= 3 and loc[0] == "models" and loc[2] in ("str", "ModelEntry"):
            # a model is a string or a mapping: report the branch the YAML took, without pydantic's tag
            if (loc[2] == "str") == isinstance(e.get("input"), dict) and len(loc) == 3:
                continue
            loc = loc[:2] + loc[3:]
        if len(loc) == 3 and loc[0] == "tasks" and loc[2] == "str" and isinstance(e.get("input"), dict):
            continue  # a task given as a mapping: its errors are the mapping's, not "not a string"
        path = _path(loc)
        if prefix:
            path = f"{prefix}.{path}" if path != "(top level)" else prefix
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            keys = known_keys(model, tuple(e["loc"])[:-1])
            msg = "unknown key" + (f" (known: {_known(keys)})" if keys else "")
        problems.append(f"{path}: {msg}")
    return problems


def _known(values, chars: int = 1000) -> str:
    """Names the registry or a matrix defines, for an error message: each cut to 60 characters, about `chars` in
    all (a matrix's own names can be anything)."""
    values = [str(v) if len(str(v)) <= 60 else str(v)[:57] + "..." for v in values]
    shown_, used = [], 0
    for v in values:
        if used + len(v) > chars:
            return ", ".join(shown_) + f" and {len(values) - len(shown_)} more"
        shown_.append(v)
        used += len(v) + 2
    return ", ".join(shown_)


def _check_sampling_override(m: Matrix, fw: str, set_name: str) -> list[str]:
    """A flag set's `sampling` override: a mapping of measure.sampling fields, on a run that samples."""
    raw = (m.flag_sets(fw)[set_name] or {}).get(SAMPLING_OVERRIDE)
    where = f"flags.{fw}.{set_name}.{SAMPLING_OVERRIDE}"
    if raw is None:
        return []
    if not isinstance(raw, dict) or not raw:
        return [f"{where}: expected a mapping of measure.sampling fields (known: {_known(Sampling.model_fields)})"]
    if m.measure.sampling is None:
        return [f"{where}: overrides measure.sampling, which is not set (set measure.sampling to draw samples)"]
    try:
        m.sampling_for(fw, set_name)
    except ValidationError as err:
        return [p + (f" (known: {_known(Sampling.model_fields)})" if p.endswith("unknown key") else "")
                for p in pydantic_problems(err, prefix=where)]
    return []


def _check_semantics(m: Matrix) -> list[str]:
    """Mistakes pydantic cannot see: names that must refer to frameworks, models, flag sets, levels."""
    problems: list[str] = []
    frameworks = list(ADAPTERS)
    for i, fw in enumerate(m.axes.framework):
        if fw not in ADAPTERS:
            problems.append(f"axes.framework[{i}]: unknown framework {shown(fw)} (known: {_known(frameworks)})")
    for i, model in enumerate(m.axes.model):
        if model not in m.models:
            problems.append(f"axes.model[{i}]: unknown model {shown(model)} (defined in models: {_known(m.models) or 'none'})")
        elif m.model_entry(model).endpoint and "serve" not in m.axes.mode:
            problems.append(f"models.{model}.endpoint: a model with an endpoint makes serve cells only, and "
                            f"axes.mode has no serve (it has: {_known(m.axes.mode)})")
    for i, q in enumerate(m.axes.quantization):
        if isinstance(q, str) and normalize_quantization(q) not in QUANTIZATIONS:
            problems.append(f"axes.quantization[{i}]: unknown quantization {shown(q)} (known: {_known(QUANTIZATIONS)})")
    for fw, sets in m.flags.items():
        if fw not in ADAPTERS:
            problems.append(f"flags.{fw}: unknown framework {shown(fw)} (known: {_known(frameworks)})")
            continue
        for set_name in sets:
            try:
                ADAPTERS[fw].Options(**m.engine_options(fw, set_name))
            except ValidationError as err:
                for p in pydantic_problems(err, prefix=f"flags.{fw}.{set_name}"):
                    known = _known([*ADAPTERS[fw].Options.model_fields, SAMPLING_OVERRIDE])
                    problems.append(p + (f" (known options for {fw}: {known})" if p.endswith("unknown key") else ""))
            problems += _check_sampling_override(m, fw, set_name)
    defined = {DEFAULT_FLAGS} | {name for sets in m.flags.values() for name in sets}
    for i, name in enumerate(m.axes.flags):
        if name not in defined:
            problems.append(f"axes.flags[{i}]: unknown flag set {shown(name)} (defined: {_known(sorted(defined))})")
    for fw in m.run.python:
        if fw not in ADAPTERS:
            problems.append(f"run.python.{fw}: unknown framework {shown(fw)} (known: {_known(frameworks)})")
    problems += _env_problems(m, frameworks)
    for section in ("include", "exclude"):
        for i, rule in enumerate(getattr(m, section)):
            problems += _check_rule(m, rule, f"{section}[{i}]", need_all=(section == "include"))
    problems += _check_rule(m, m.baseline, "baseline", need_all=False, allow_lists=False)
    problems += task_sets.problems(m.tasks)
    if m.serve.search is not None:
        problems += _search_problems(m)
    problems += _arrival_problems(m)
    problems += _workload_problems(m)
    return problems


def _env_problems(m: Matrix, frameworks) -> list[str]:
    """The env axis names `envs` entries; each env's interpreter exists here (unless cluster_only), so a
    missing one is said before any engine starts."""
    problems = []
    for i, name in enumerate(m.axes.env or ()):
        if not m.envs or name not in m.envs:
            known = _known(m.envs or ()) or "none"
            problems.append(f"axes.env[{i}]: unknown env {shown(name)} (defined in envs: {known})")
    for name, env in (m.envs or {}).items():
        pythons = [(f"envs.{name}.python", env.python)] if isinstance(env.python, str) else \
            [(f"envs.{name}.python.{fw}", p) for fw, p in env.python.items()]
        for path, python in pythons:
            fw = path.rsplit(".", 1)[1]
            if not isinstance(env.python, str) and fw not in ADAPTERS:
                problems.append(f"{path}: unknown framework {shown(fw)} (known: {_known(frameworks)})")
            elif not env.cluster_only and not Path(python).exists():
                problems.append(f"{path}: interpreter {shown(python)} does not exist (create it, e.g. `bench env "
                                f"{name} --pip PACKAGE==VERSION`, or set cluster_only: true where only the nodes have it)")
    if m.envs is not None and not m.envs:
        problems.append("envs: no env named (give at least two, or leave envs out)")
    return problems


def _workload_problems(m: Matrix) -> list[str]:
    """One workload section or named ones with their axis; then every workload the cells run on its own."""
    problems = []
    names = list(m.workloads or ())
    if m.workloads is not None and "workload" in m.model_fields_set:
        problems.append("workloads: give either workload (one workload for every cell) or workloads (named, "
                        "with the workload axis), not both")
    if m.workloads is not None and not names:
        problems.append("workloads: no workload named (give at least one, or use the single workload section)")
    if m.axes.workload is not None and m.workloads is None:
        problems.append("axes.workload: the axis names entries of workloads, and the matrix defines none "
                        "(a single workload section needs no axis)")
    for i, name in enumerate(m.axes.workload or ()):
        if m.workloads is not None and name not in m.workloads:
            problems.append(f"axes.workload[{i}]: unknown workload {shown(name)} (defined in workloads: "
                            f"{_known(names) or 'none'})")
    run = m.named_workloads()
    for path, w in run:
        problems += _one_workload_problems(m, path, w)
    for axis in ("input_len", "output_len"):
        # the axis applies to the workloads that do not draw these lengths; with none left it sweeps nothing
        drawing = [p for p, w in run if getattr(w, f"{axis[:-4]}_lengths", None) is not None]
        if m.workloads and axis in m.axes.model_fields_set and run and len(drawing) == len(run):
            where = ", ".join(f"{p}.{axis[:-4]}_lengths" for p in drawing)
            problems.append(f"axes.{axis}: every workload draws these lengths ({where}); leave the axis out")
    return problems


def _one_workload_problems(m: Matrix, path: str, w) -> list[str]:
    """Lengths drawn by the workload leave no fixed-length axis to sweep; a local file must exist and parse."""
    problems = []
    if isinstance(w, SyntheticWorkload):
        for axis, dist in (("input_len", w.input_lengths), ("output_len", w.output_lengths)):
            # with several workloads the axis is the other workloads' (this one's cells name the mean)
            if dist is not None and axis in m.axes.model_fields_set and path == "workload":
                problems.append(f"axes.{axis}: the workload draws these lengths (workload.{axis[:-4]}_lengths); "
                                f"leave the axis out, or drop workload.{axis[:-4]}_lengths for a fixed sweep")
        if w.prefix_groups > 1 and not w.shared_prefix_len:
            problems.append(f"{path}.prefix_groups: prefix groups need {path}.shared_prefix_len > 0 (the "
                            "tokens each group's requests share)")
        if w.input_lengths is not None and w.shared_prefix_len >= w.input_lengths.min:
            problems.append(f"{path}.shared_prefix_len: {w.shared_prefix_len} tokens is not below the shortest "
                            f"drawn prompt ({path}.input_lengths.min {w.input_lengths.min})")
    elif isinstance(w, HfWorkload):
        problems += hf_datasets.problems(w, path)
    elif isinstance(w, TraceWorkload):
        why = None if w.cluster_only else traces.check(w.path)
        if why:
            problems.append(f"{path}.path: {why}")
    elif not w.cluster_only:
        why = datasets.check(w.kind, w.path, getattr(w, "field", "text"), getattr(w, "output_field", None))
        if why:
            problems.append(f"{path}.path: {why}")
    return problems + _chat_problems(m, w, path)


def _chat_problems(m: Matrix, w, where: str) -> list[str]:
    """A chat workload needs a chat template: checked here for local tokenizers (a hub model's is checked
    on the node, where a model without one gives `unsupported` rows)."""
    if not getattr(w, "chat", False):
        return []
    out = []
    for name in dict.fromkeys(m.axes.model):
        if name not in m.models:
            continue
        entry = m.model_entry(name)
        src = entry.tokenizer or entry.source
        if src.startswith("builtin:"):
            continue   # the built-in models carry a chat template (orchestrator/inputs/tiny_model.py)
        if chat.has_local_template(src) is False:
            key = "tokenizer" if entry.tokenizer else "source"
            out.append(f"{where}.chat: model '{name}' has no chat template (models.{name}.{key}: {src} has no "
                       "chat_template in tokenizer_config.json, no chat_template.jinja); drop chat (the "
                       f"conversations go as 'User: ...' text), or give models.{name}.tokenizer a tokenizer dir "
                       "with a chat template")
    if isinstance(w, HfWorkload) and not w.messages_field:
        out.append(f"{where}.chat: chat needs conversations: set {where}.messages_field (the column of "
                   "[{role, content}] turns), not field")
    return out


def deferred_checks(m: Matrix) -> list[str]:
    """What bench validate cannot check on this machine, said rather than passed over: hub datasets and the
    chat templates of hub models are looked at on the node that runs the cells."""
    out = []
    for path, w in m.named_workloads():
        if isinstance(w, HfWorkload) and not hf_datasets.is_local(w.name):
            out.append(f"{path}.name: '{w.name}' is not a local path: a hub dataset (or a path on the cluster), "
                       "loaded (and its fields checked) on the node that runs the cells, not here")
        if getattr(w, "chat", False):
            for name in dict.fromkeys(m.axes.model):
                entry = m.model_entry(name) if name in m.models else None
                src = entry and (entry.tokenizer or entry.source)
                if src and not src.startswith("builtin:") and chat.has_local_template(src) is None:
                    out.append(f"{path}.chat: model '{name}' ({src}) is not local: its chat template is checked on "
                               "the node (none there: unsupported rows)")
    return out


def _arrival_problems(m: Matrix) -> list[str]:
    """A ramp sets its own rates, a trace its own times: a request_rate axis or a rate search beside them would
    sweep nothing."""
    out = _trace_schedule_problems(m)
    a = m.serve.arrival
    if a.kind != "ramp":
        return out
    rates = [r for r in m.axes.request_rate if not math.isinf(r)]
    if "request_rate" in m.axes.model_fields_set and rates:
        out.append(f"axes.request_rate: serve.arrival is a ramp ({a.start_rate:g} to {a.end_rate:g} requests/s over "
                   f"{a.duration_s:g} s), which sets its own rates; leave the axis out, or use an arrival at "
                   "request_rate (constant, poisson, {kind: gamma, burstiness: ...})")
    if m.serve.search is not None and m.serve.search.variable == "rate":
        out.append("serve.search: a rate search sets the request rate, and serve.arrival is a ramp with rates of its "
                   "own; use constant, poisson or {kind: gamma, burstiness: ...} with a search")
    return out


def _trace_schedule_problems(m: Matrix) -> list[str]:
    run = m.named_workloads()
    paths = [p for p, w in run if isinstance(w, TraceWorkload)]
    if not paths:
        return []
    out = []
    if m.serve.search is not None:
        out.append(f"serve.search: {paths[0]} is a trace, whose serve cells arrive at its own times; a search needs "
                   "workloads that request_rate paces (synthetic, jsonl, text, sharegpt, hf)")
    rates = [r for r in m.axes.request_rate if not math.isinf(r)]
    if len(paths) == len(run) and "request_rate" in m.axes.model_fields_set and rates:
        out.append(f"axes.request_rate: {paths[0]} is a trace: its requests arrive at its own times "
                   f"({paths[0]}.time_scale scales them); leave the axis out")
    return out


def _search_problems(m: Matrix) -> list[str]:
    """A search config that could not give an answer, said before anything starts."""
    from adapters.contract.intervals import min_values_for_upper_bound

    s, out = m.serve.search, []
    slos = ("ttft_p99_ms", "tpot_p99_ms", "e2e_p99_ms", "goodput")
    if all(getattr(s, k) is None for k in slos):
        out.append(f"serve.search: no SLO to search against (give at least one of: {_known(slos)})")
    if s.low >= s.high:
        out.append(f"serve.search.high: must be above low ({s.low:g}), got {s.high:g}")
    if s.variable == "concurrency":
        for key in ("low", "high"):
            if getattr(s, key) != int(getattr(s, key)):
                out.append(f"serve.search.{key}: a concurrency is a whole number, got {getattr(s, key):g}")
    if s.goodput is not None and all(getattr(m.serve, k) is None for k in ("slo_ttft_ms", "slo_tpot_ms", "slo_e2e_ms")):
        out.append("serve.search.goodput: goodput counts requests within the per-request SLOs, and none is set "
                   "(set serve.slo_ttft_ms, slo_tpot_ms or slo_e2e_ms)")
    if "serve" not in m.axes.mode:
        out.append(f"serve.search: searches serve cells, and axes.mode has no serve (it has: {_known(m.axes.mode)})")
    if any(not math.isinf(r) for r in m.axes.request_rate):
        out.append("axes.request_rate: serve.search chooses the load of every serve cell; leave the axis out "
                   f"(it has: {_known(m.axes.request_rate)})")
    if m.measure.repeats == "auto":
        out.append("measure.repeats: 'auto' is not supported with serve.search (give a number of timed runs per probe)")
    elif s.judge == "interval" and any(getattr(s, k) is not None for k in slos[:3]):
        need = min_values_for_upper_bound(0.99, s.level)
        have = m.serve.requests * m.measure.repeats
        if have < need:
            out.append(f"serve.search.judge: 'interval' needs at least {need} requests per probe for a p99's "
                       f"{s.level:.0%} interval to have an upper end; serve.requests x measure.repeats is {have} "
                       f"(raise them, or use judge: point)")
    return out


def _check_rule(m: Matrix, rule: dict, path: str, need_all: bool, allow_lists: bool = True) -> list[str]:
    problems = []
    if not isinstance(rule, dict):
        return [f"{path}: expected a mapping of axis -> value"]
    for key, value in rule.items():
        if key not in AXES:
            problems.append(f"{path}.{key}: unknown axis (known: {_known(AXES)})")
            continue
        values = value if isinstance(value, list) and allow_lists and not need_all else [value]
        for v in values:
            bad = _bad_axis_value(m, key, v)
            if bad:
                problems.append(f"{path}.{key}: {bad}")
    if need_all:
        # an include entry may leave an axis out only where that axis has a single value
        for axis in AXES:
            if axis not in rule and len(axis_values(m, axis)) != 1:
                problems.append(f"{path}: missing axis '{axis}' (the axis has several values, so the cell is ambiguous)")
    return problems


def _bad_axis_value(m: Matrix, axis: str, v: Any) -> str | None:
    if isinstance(v, (list, dict)):   # (a rule's list is taken apart before this, where lists are allowed)
        return f"expected one value of the axis, got {shown(v)}"
    if axis == "framework" and v not in ADAPTERS:
        return f"unknown framework {shown(v)} (known: {_known(ADAPTERS)})"
    if axis == "model" and v not in m.models:
        return f"unknown model {shown(v)} (defined in models: {_known(m.models)})"
    # a rule names a recipe by its short form, recipe-<name> (its name is read with the file, after this check)
    recipes = any(isinstance(q, RecipeRef) for q in m.axes.quantization)
    if axis == "quantization" and (not isinstance(v, str) or normalize_quantization(v) not in QUANTIZATIONS) \
            and not (recipes and isinstance(v, str) and v.startswith("recipe-")):
        return f"unknown quantization {shown(v)} (known: {_known(QUANTIZATIONS)}" + (", recipe-<name>)" if recipes else ")")
    if axis in ("batch_size", "input_len", "output_len") and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
        return f"expected a positive integer, got {shown(v)}"
    if axis == "mode" and v not in MODES:
        return f"unknown mode {shown(v)} (known: {_known(MODES)})"
    if axis == "request_rate" and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0):
        return f"expected a positive number of requests/s (.inf: a closed loop), got {shown(v)}"
    if axis == "env" and (not m.envs or v not in m.envs):
        return f"unknown env {shown(v)} (defined in envs: {_known(m.envs or ()) or 'none'})"
    if axis == "workload" and (not m.workloads or v not in m.workloads):
        return f"unknown workload {shown(v)} (defined in workloads: {_known(m.workloads or ()) or 'none'})"
    if axis == "flags":
        defined = {DEFAULT_FLAGS} | {name for sets in m.flags.values() for name in sets}
        if v not in defined:
            return f"unknown flag set {shown(v)} (defined: {_known(sorted(defined))})"
    return None


def parse_matrix(data: Any, source: str = "matrix") -> Matrix:
    if not isinstance(data, dict):
        raise MatrixError(["(top level): expected a mapping with at least 'models' and 'axes'"], source)
    try:
        matrix = Matrix.model_validate(data)
    except ValidationError as err:
        raise MatrixError(pydantic_problems(err, model=Matrix), source) from None
    too_many = _cell_count_problem(matrix)
    if too_many:   # before anything walks the product of the axes
        raise MatrixError([too_many], source)
    problems = _check_semantics(matrix)
    if problems:
        raise MatrixError(problems, source)
    return matrix


MAX_CELLS_ENV = "BENCH_MAX_CELLS"
MAX_CELLS = 100_000   # the largest shipped matrix has a few hundred cells


def max_cells() -> int:
    """The most cells a matrix may expand to: MAX_CELLS, or BENCH_MAX_CELLS where set (raised deliberately)."""
    raw = os.environ.get(MAX_CELLS_ENV, "")
    return int(raw) if raw.strip().isdigit() else MAX_CELLS


def _cell_count_problem(m: Matrix) -> str | None:
    """The product of the axes' lengths (plus include rules), computed without expanding them: over
    max_cells() is refused, naming the bound and how to raise it."""
    count = math.prod(len(axis_values(m, a)) for a in AXES) + len(m.include)
    bound = max_cells()
    if count <= bound:
        return None
    sizes = ", ".join(f"{a} {len(axis_values(m, a))}" for a in AXES if len(axis_values(m, a)) > 1)
    return (f"axes: {count:,} combinations of axis values ({sizes}) is more than {bound:,} cells; split the "
            f"matrix, or set {MAX_CELLS_ENV}={count} to run it deliberately")


# values a matrix may expand to through YAML aliases (the largest shipped matrix has a few hundred)
MAX_VALUES = 100_000


def expanded_size(data: Any) -> dict[int, int]:
    """Values each mapping or list holds written out (aliases counted at every use), by id, in time
    linear in the YAML's nodes: an alias bomb of a kilobyte expands to billions."""
    sizes: dict[int, int] = {}

    def size(node: Any) -> int:
        if not isinstance(node, (dict, list)):
            return 1
        if id(node) not in sizes:
            sizes[id(node)] = 0   # a cycle (not possible from safe_load, but cheap to stop)
            items = [*node.keys(), *node.values()] if isinstance(node, dict) else node
            sizes[id(node)] = 1 + sum(size(x) for x in items)
        return sizes[id(node)]

    size(data)
    return sizes


def _too_large(data: Any) -> str | None:
    """The YAML path of the smallest part that alone expands past MAX_VALUES, or None."""
    sizes = expanded_size(data)
    if sizes.get(id(data), 1) <= MAX_VALUES:
        return None
    path, node = "(top level)", data
    while True:
        kids = list(node.items()) if isinstance(node, dict) else list(enumerate(node))
        big = [(k, v) for k, v in kids if sizes.get(id(v), 1) > MAX_VALUES]
        if not big:
            return path
        key, node = big[0]
        path = (f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}").removeprefix("(top level).")


def load_matrix(path: str | Path) -> tuple[Matrix, str]:
    """Read and validate a matrix file; returns the model and the text as given (for the manifest)."""
    text = read_text(path)
    m = parse_matrix_text(text, str(path))
    problems = local_path_problems(m, Path(path).absolute().parent)
    if problems:
        raise MatrixError(problems, str(path))
    return m, text


def parse_matrix_text(text: str, source: str = "matrix") -> Matrix:
    """A matrix's YAML text, validated (what `bench validate` reads from its file)."""
    data = load_yaml(text, source)
    where = _too_large(data)
    if where:   # checked before anything walks it whole (validation, an error message)
        raise MatrixError([f"{where}: holds more than {MAX_VALUES:,} values (written out, a YAML alias (*) counted "
                           "at each use); split the matrix, or use fewer aliases of aliases"], source)
    return parse_matrix(data, source)


def json_schema() -> dict:
    return Matrix.model_json_schema()
