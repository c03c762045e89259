"""`bench explain RUN CELL --sensitivity`: where a llama.cpp cell's quantization loss comes from, tensor group by
tensor group. Each probe is the cell's configuration (engine, flags, batch size, lengths) with every weight at F32
but one group (one layer's attn_q/k/v/output or ffn_gate/up/down, the token embeddings, the output) at the type it
has in the cell's own file, made by llama.cpp's quantizer with per-tensor overrides: the llama.cpp option
`tensor_types` (adapters/engines/llamacpp/tensor_mix.py), so every probe is an ordinary cell a matrix can name
again. One more probe quantizes every group ("all"): the cell's own file, rebuilt through the overrides.

The probes are judged against the same configuration at fp32 (the F32 GGUF the cell's file is quantized from),
not against the run's baseline: the loss measured is the quantization's alone, not the engine's. They run as a
probe matrix through the normal runner into RUN/explain/<cell_id>/sensitivity/ (its matrix beside it, in
sensitivity.yaml); stored cells are skipped, so no probe runs twice, also across calls. The table (group, type,
bytes, KL mean, top-1, verdict) goes to RUN/explain/<cell_id>/sensitivity.json and sensitivity.parquet.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import yaml
from pydantic import BaseModel, Field
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from adapters import ADAPTERS
from adapters.base import normalize_quantization
from orchestrator.matrix.cells import expand
from orchestrator.matrix.models import Matrix
from orchestrator.matrix.validate import parse_matrix
from orchestrator.store.explain_file import EXPLAIN_DIR, portable_json
from orchestrator.values import finite

SENS_DIR = "sensitivity"             # RUN/explain/<cell_id>/sensitivity/: the probes' run dir
SENS_FILE = "sensitivity.json"
SENS_TABLE = "sensitivity.parquet"
ALL = "all"                          # the probe that quantizes every group: the cell's own file
FLOAT_LEVELS = ("fp32", "fp16", "bf16", "gguf")
METRICS = ("kl_mean", "top1", "max_abs")


class GroupProbe(BaseModel):
    """One row of the table: a group quantized as in the cell's file, everything else F32."""

    group: str                        # blk.0.attn_q, token_embd, output; `all` for every group at once
    type: str                         # its ggml type in the cell's file (q4_0, q8_0, ...)
    pattern: str = ""                 # the regex naming its tensors (`tensor_types`' key)
    tensors: int = 0
    bytes: int = 0                    # the group's bytes at that type (all: every group's)
    f32_bytes: int = 0                # ... and at F32
    flags: str = ""                   # the probe's flag set in sensitivity.yaml
    cell_id: str | None = None
    status: str = ""
    reason: str | None = None
    verdict: str | None = None
    kl_mean: float | None = None      # mean KL(fp32 || probe) over the scoring positions
    top1: float | None = None         # top-1 agreement with fp32
    max_abs: float | None = None
    n_positions: int | None = None    # the sample the KL mean is over


class SensitivityResult(BaseModel):
    run: str
    cell_id: str
    config: str
    quantization: str
    reference: str                    # what each probe is judged against
    reference_cell_id: str | None = None
    test: str = ("each probe's logprobs against the reference's, position by position on the run's scoring prompts "
                 "(orchestrator/judge): KL mean over positions, top-1 agreement, max |logprob diff|; its verdict "
                 "with the run's tolerances")
    groups: list[GroupProbe] = Field(default_factory=list)
    probe_run: str
    wall_s: float = 0.0


def sensitivity_path(run_dir: str | Path, cell_id: str, name: str = SENS_FILE) -> Path:
    return Path(run_dir) / EXPLAIN_DIR / cell_id / name


def check_cell(cell: dict[str, Any], options: dict[str, Any]) -> None:
    """ValueError unless the cell is one whose tensors can be quantized group by group."""
    quant = normalize_quantization(cell["quantization"])
    if cell["framework"] != "llamacpp":
        raise ValueError(f"--sensitivity quantizes tensor groups with llama.cpp's quantizer: cell {cell['cell_id']} "
                         f"is {cell['framework']}")
    if quant in FLOAT_LEVELS:
        raise ValueError(f"--sensitivity needs a quantized cell (q8_0, q4_0, ...): cell {cell['cell_id']} is {quant}")
    if options.get("tensor_types"):
        raise ValueError(f"cell {cell['cell_id']} already names tensor_types: --sensitivity starts from a preset level")


def probe_configs(groups: list[dict[str, Any]], options: dict[str, Any]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Flag-set name -> (the table row's group facts, the probe's engine options), one per group and `all`."""
    group_tensor_types = ADAPTERS["llamacpp"].group_tensor_types
    out = {}
    for g in groups:
        out[f"xs-{g['group']}"] = (g, {**options, "tensor_types": group_tensor_types([g])})
    types = sorted({g["type"] for g in groups})
    every = {"group": ALL, "type": "+".join(types), "tensors": sum(g["tensors"] for g in groups),
             "bytes": sum(g["bytes"] for g in groups), "f32_bytes": sum(g["f32_bytes"] for g in groups)}
    out[f"xs-{ALL}"] = (every, {**options, "tensor_types": group_tensor_types(groups)})
    return out


def matrix_data(m: Matrix, cell: dict[str, Any], options: dict[str, Any], probes: dict[str, dict[str, Any]],
                presets: tuple[str, ...] = (), timed: bool = False,
                preset_set: tuple[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The probe matrix: the cell's configuration at fp32 (the reference, the matrix's baseline) and one include
    per probe (flag set -> engine options) at the cell's quantization, plus the cell's flags (or `preset_set`, a
    flag set of its own: name, options) at each of `presets`; at the cell's batch size, lengths and workload. Not
    `timed`: the logit and text layers only (one timed batch, no warm-up, samples or tasks); `timed`: the run's
    measure and tasks, as a normal cell."""
    data = m.model_dump(mode="json", exclude_unset=True)
    fw, flags = cell["framework"], cell["flags"]
    sets = {**({flags: options} if flags != "default" else {}), **probes, **dict([preset_set] if preset_set else [])}
    same = {"model": cell["model"], "batch_size": int(cell["batch_size"]), "input_len": int(cell["input_len"]),
            "output_len": int(cell["output_len"]), "mode": cell["mode"]}
    axes: dict[str, Any] = {"framework": [fw], "quantization": ["fp32"], "flags": [flags],
                            **{k: [v] for k, v in same.items()}}
    extra = {k: cell[k] for k in ("workload", "env") if isinstance(cell.get(k), str)}
    axes |= {k: [v] for k, v in extra.items()}
    level = normalize_quantization(cell["quantization"])
    include = [{"framework": fw, "quantization": level, "flags": name, **same, **extra} for name in probes]
    include += [{"framework": fw, "quantization": q, "flags": preset_set[0] if preset_set else flags, **same, **extra}
                for q in presets]
    measure = {k: v for k, v in data.get("measure", {}).items() if k != "sampling"}
    out = data | {"models": {cell["model"]: data["models"][cell["model"]]}, "axes": axes, "flags": {fw: sets},
                  "include": include, "exclude": [],
                  "baseline": {"framework": fw, "quantization": "fp32", "flags": flags, "mode": cell["mode"]}}
    if not timed:
        out |= {"tasks": [], "measure": measure | {"warmup": 0, "repeats": 1, "paired_timing": False}}
    return out | {"name": f"{'recipe' if timed else 'sensitivity'}-{cell['cell_id']}"}


def run_probes(folder: Path, name: str, data: dict[str, Any], address: str | None, console: Console) -> tuple[Matrix, pd.DataFrame]:
    """Write `data` as folder/<name>.yaml and run it into folder/<name>/ (stored cells skipped); (its matrix,
    its cells judged against the reference by cell id)."""
    from orchestrator.execution.runner import run_matrix
    from orchestrator.judge.verdicts import judge_run
    from orchestrator.store.run_store import atomic_write_text

    parsed = parse_matrix(data, f"{name}.yaml")          # the same checks as any matrix, before Ray
    atomic_write_text(folder / f"{name}.yaml", "# written by `bench explain` (orchestrator/explain/)\n"
                      + yaml.safe_dump(data, sort_keys=False))
    run_matrix(folder / f"{name}.yaml", folder / name, address, console=console, quiet=True)
    judged = judge_run(folder / name, tasks=False, sampling=False).cells.drop_duplicates("cell_id").set_index("cell_id")
    return parsed, judged


def fill(p: BaseModel, judged: pd.DataFrame, fields: tuple[str, ...] = METRICS) -> None:
    """A probe's status, verdict and `fields` from its judged row (said missing where the run stored none)."""
    row = judged.loc[p.cell_id] if p.cell_id in judged.index else None
    if row is None:   # the runner stores every cell it was given: say so, never guess
        p.status, p.reason = "missing", "the probe run stored no row for this cell"
        return
    p.status = str(row["status"])
    p.reason = row.get("reason") if isinstance(row.get("reason"), str) else None
    p.verdict = row.get("verdict") if isinstance(row.get("verdict"), str) else None
    for k in (*fields, "n_positions"):
        v = row.get(k)
        setattr(p, k, (int(v) if k == "n_positions" else float(v)) if finite(v) else None)


def cell_groups(m: Matrix, cell: dict[str, Any]) -> list[dict[str, Any]]:
    """The quantized weight groups of the cell's own GGUF (made from the model's F32 conversion if not cached)."""
    from orchestrator.execution.engine_child.spec import resolve_source
    from orchestrator.execution.runner import cache_root

    source = resolve_source(m.model_entry(cell["model"]).source, str(cache_root()))
    return ADAPTERS["llamacpp"].tensor_groups(source, normalize_quantization(cell["quantization"]), str(cache_root()))


def run_sensitivity(run_dir: Path, cell: dict[str, Any], config: str, address: str | None, console: Console,
                    quiet: bool) -> SensitivityResult:
    """Probe every group of one cell, judge them against the fp32 reference, store and return the table."""
    from orchestrator.store.run_store import RunStore, atomic_write_table, atomic_write_text

    started = time.monotonic()
    m = RunStore(run_dir).read_manifest().matrix
    if m is None:
        raise ValueError(f"{run_dir}'s stored matrix is not one this version reads: the probes cannot be built")
    options = m.engine_options(cell["framework"], cell["flags"])
    check_cell(cell, options)
    groups = cell_groups(m, cell)
    if not groups:
        raise ValueError(f"cell {cell['cell_id']}'s file has no quantized weight: nothing to probe")
    configs = probe_configs(groups, options)
    data = matrix_data(m, cell, options, {name: opts for name, (_, opts) in configs.items()})
    folder = Path(run_dir) / EXPLAIN_DIR / cell["cell_id"]
    if not quiet:
        console.print(f"explain {cell['cell_id']} --sensitivity: {len(configs)} probes ({len(groups)} groups and all)")
    parsed, judged = run_probes(folder, SENS_DIR, data, address, console)
    probe_run = folder / SENS_DIR
    ids = {(c.flags, c.quantization): c.cell_id for c in expand(parsed)}
    rows = []
    for name, (g, _) in configs.items():
        p = GroupProbe(**g, flags=name, cell_id=ids.get((name, normalize_quantization(cell["quantization"]))))
        fill(p, judged)
        rows.append(p)
    ref = ids.get((cell["flags"], "fp32"))
    result = SensitivityResult(run=str(run_dir), cell_id=cell["cell_id"], config=config,
                               quantization=normalize_quantization(cell["quantization"]),
                               reference=f"{cell['framework']}/{cell['model']}/fp32/{cell['flags']}/b{int(cell['batch_size'])}",
                               reference_cell_id=ref, groups=rows, probe_run=str(probe_run),
                               wall_s=round(time.monotonic() - started, 1))
    atomic_write_text(sensitivity_path(run_dir, cell["cell_id"]), portable_json(result, run_dir))
    atomic_write_table(pa.Table.from_pandas(pd.DataFrame([r.model_dump() for r in rows]), preserve_index=False),
                       sensitivity_path(run_dir, cell["cell_id"], SENS_TABLE))
    return result


def sensitivity_table(result: SensitivityResult) -> Table:
    t = Table(title=f"sensitivity {result.cell_id}: {result.config}, one group at {result.quantization}'s types, "
              f"the rest F32, against {result.reference}", title_justify="left")
    for col in ("group", "type", "bytes", "f32 bytes", "kl_mean", "top1", "verdict"):
        t.add_column(col, justify="left" if col in ("group", "type", "verdict") else "right")
    for g in sorted(result.groups, key=lambda g: (g.group == ALL, -(g.kl_mean or 0.0))):
        t.add_row(escape(g.group), g.type, str(g.bytes), str(g.f32_bytes),
                  *(f"{v:.3g}" if v is not None else "-" for v in (g.kl_mean, g.top1)),
                  escape((g.verdict or "-") if g.status == "ok" else f"{g.status}: {g.reason or ''}"))
    return t


def print_sensitivity(result: SensitivityResult, console: Console) -> None:
    console.print(sensitivity_table(result))
    n = {g.n_positions for g in result.groups if g.n_positions}
    console.print(f"  {len(result.groups)} probes, {result.wall_s:.0f} s; KL mean over "
                  f"{'/'.join(map(str, sorted(n))) or 'the'} scoring positions per probe; the probes: "
                  f"{escape(result.probe_run)}; the table: {escape(str(sensitivity_path(result.run, result.cell_id)))}")
