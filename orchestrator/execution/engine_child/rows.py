"""What a worker left on disk, turned into the rows the store keeps: each cell's `CellResult` (its
cells row and its logprob, task and sample tables, handed back through Ray as Arrow IPC), the rows
of an SLO search's probes, and engine output scrubbed of machine paths.
"""

from __future__ import annotations

import hashlib
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from adapters.contract.events import Loaded
from adapters.contract.records import LOGPROB_COLUMNS, LOGPROB_KINDS, PROBES, TASK_OUTPUTS, CellRecord, TaskError
from orchestrator.execution.engine_child.prompts import Tokenizer
from orchestrator.execution.engine_child.spec import PROJECT_ROOT, GroupJob, load_kind
from orchestrator.inputs.task_metrics import task_rows
from orchestrator.matrix.cells import Cell
from orchestrator.matrix.models import stable_dump
from orchestrator.store.schema import CELLS_SCHEMA, LOGPROBS_SCHEMA, SAMPLES_SCHEMA, TASKS_SCHEMA


class CellResult(NamedTuple):
    """What the driver stores for one cell: its row, and its logprob and task rows where it has them."""

    row: dict
    logprobs: pa.Table | None = None
    tasks: pa.Table | None = None
    samples: pa.Table | None = None

    def packed(self) -> CellResult:
        """The tables as Arrow IPC streams, for the hand-back through Ray: Ray's own pickling of a pa.Table
        imports pyarrow.compute and pandas in the Ray worker on first use (0.4-0.6 s of a run's first
        group, and of every GPU group: each gets a fresh Ray worker). The buffers travel zero-copy."""
        return self._replace(**{k: ipc_buffer(t) for k, t in self._tables()})

    def unpacked(self) -> CellResult:
        """The driver's side of packed(): the tables again (zero-copy over the received buffers)."""
        return self._replace(**{k: pa.ipc.open_stream(b).read_all() for k, b in self._tables()})

    def _tables(self) -> list[tuple[str, Any]]:
        return [(k, v) for k, v in zip(self._fields[1:], self[1:]) if v is not None]


def ipc_buffer(table: pa.Table) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def read_task_rows(run_id: str, cell_id: str, path: Path, tasks: dict, tok: Tokenizer) -> tuple[pa.Table | None, dict]:
    """A cell's task outputs scored into tasks-table rows, and {task:<name>: why} for tasks that did not run."""
    if not path.exists():
        return None, {}
    rows, missing = [], {}
    for out in TASK_OUTPUTS.validate_json(path.read_bytes()):
        if isinstance(out, TaskError):
            missing[f"task:{out.name}"] = scrub_paths(out.reason)
            continue
        entry, items = tasks[out.name]
        rows += [r | {"run_id": run_id, "cell_id": cell_id} for r in task_rows(entry, items, out, tok)]
    return (pa.Table.from_pylist(rows, schema=TASKS_SCHEMA) if rows else None), missing


def _arrow(values: np.ndarray, type_: pa.DataType) -> pa.Array:
    """A numpy array as Arrow, zero-copy over its buffer. pa.array() would import pandas and pyarrow.compute
    on first use (about 0.5 s of CPU, more on a busy host) in this process, while the child times its next cell."""
    values = np.ascontiguousarray(values, dtype=type_.to_pandas_dtype())
    return pa.Array.from_buffers(type_, len(values), [None, pa.py_buffer(values)])


def _strings(values: list[bytes]) -> pa.Array:
    offsets = np.zeros(len(values) + 1, np.int32)
    np.cumsum([len(v) for v in values], out=offsets[1:])
    return pa.Array.from_buffers(pa.string(), len(values), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(values))])


def _fixed_lists(values: np.ndarray, type_: pa.DataType) -> pa.Array:
    """A [rows, k] array as an Arrow list column of k values per row, zero-copy over its buffer."""
    n, k = values.shape
    return pa.ListArray.from_arrays(_arrow(np.arange(0, (n + 1) * k, k), pa.int32()), _arrow(values.reshape(-1), type_))


def read_logprob_rows(run_id: str, cell_id: str, npz: Path) -> pa.Table | None:
    """A worker's logprob rows (adapters.contract.records.LOGPROB_COLUMNS) as the store's table."""
    data = np.load(npz)
    if "token_id" not in data or data["token_id"].size == 0:
        return None
    n = data["token_id"].size
    columns = {"run_id": _strings([run_id.encode()] * n), "cell_id": _strings([cell_id.encode()] * n)}
    names = [k.encode() for k in LOGPROB_KINDS]
    for name, _, is_list in LOGPROB_COLUMNS:
        t = LOGPROBS_SCHEMA.field(name).type
        if name == "kind":
            columns[name] = _strings([names[x] for x in data[name].tolist()])
        elif is_list:
            columns[name] = _fixed_lists(data[name], t.value_type)
        else:
            columns[name] = _arrow(data[name], t)
    return pa.table(columns, schema=LOGPROBS_SCHEMA)


def read_sample_rows(run_id: str, cell_id: str, npz: Path) -> pa.Table | None:
    """A worker's samples (adapters.contract.records.SAMPLE_COLUMNS) as the store's table."""
    if not npz.exists():
        return None
    data = np.load(npz)
    n = data["token_ids"].shape[0] if data["token_ids"].ndim == 2 else 0
    if not n:
        return None
    columns = {"run_id": _strings([run_id.encode()] * n), "cell_id": _strings([cell_id.encode()] * n)}
    for name in ("repeat", "prompt_index", "seed"):
        columns[name] = _arrow(data[name], SAMPLES_SCHEMA.field(name).type)
    for name in ("token_ids", "logprobs", "next_topk_ids", "next_topk_logprobs"):
        values = data[name] if name in data else np.zeros((n, 0))   # a worker of before next_top_k
        columns[name] = _fixed_lists(values, SAMPLES_SCHEMA.field(name).type.value_type)
    return pa.table(columns, schema=SAMPLES_SCHEMA)


def _places() -> tuple[tuple[str, str], ...]:
    """(this machine's path, the name results store it by), in the order they are replaced."""
    return ((tempfile.gettempdir(), "<tmp>"), (str(PROJECT_ROOT), "<project>"), (sys.prefix, "<python>"),
            (os.path.expanduser("~"), "~"))


def scrub_paths(text: str | None) -> str | None:
    """Reasons quote engine output and tracebacks: keep this machine's paths out of shared results."""
    if not text:
        return text
    for path, name in _places():
        text = text.replace(path, name)
    return text


def local_path(path: str) -> Path:
    """A path as a row stores it (scrub_paths: <project>, <tmp>, <python>, ~), as a path on this machine."""
    for real, name in _places():
        if path.startswith(name + "/"):
            return Path(real + path[len(name):])
    return Path(path)


def probe_id(search_id: str, probe: int) -> str:
    return hashlib.sha256(f"{search_id}/probe/{probe}".encode()).hexdigest()[:16]


def probe_rows(job: GroupJob, cell: Cell, path: Path, loaded: Loaded | None, attempt: int) -> list[CellResult]:
    """An SLO search's probes (adapters.serving.slo_search) as rows: each at its own load point, named by the
    search (search_id) and its number; their outputs were not captured (the search's row has them)."""
    if not path.exists():
        return []
    rows = []
    for p in PROBES.validate_json(path.read_bytes()):
        closed = p.rate is None
        rec = p.record
        rec.missing["logprobs"] = "a search probe: the outputs are captured once, on the search's own row"
        rows.append(CellResult(cell_row(
            job, cell, "ok", attempt=attempt, loaded=loaded, record=rec, cell_id=probe_id(cell.cell_id, rec.search_probe),
            batch_size=p.concurrency, request_rate=math.inf if closed else p.rate,
            load="closed" if closed else job.matrix.serve.arrival.kind)))
    return rows


def with_traceback(ev) -> str:
    return ev.reason + (f"\n{ev.traceback}" if getattr(ev, "traceback", None) else "")


def cell_row(job: GroupJob, cell: Cell, status: str, reason: str | None = None, *, attempt: int | None = None,
             loaded: Loaded | None = None, record: CellRecord | None = None, **columns: Any) -> dict[str, Any]:
    """The one builder of a cell's row (the columns of orchestrator/store/schema.py's cells table): the
    cell's configuration, its status and why, the facts its engine reported after load, what the worker
    measured, and `columns` over those (a probe's own load point). Values stay Python values (dicts and
    lists in the JSON columns: the store encodes them); a name that is no column is an error here,
    where the row is made."""
    m = job.matrix
    row: dict[str, Any] = {
        "run_id": job.run_id, "cell_id": cell.cell_id, "engine_key": cell.engine_key,
        "framework": cell.framework, "model": cell.model, "quantization": cell.quantization,
        "flags": cell.flags, "flags_json": cell.options,
        "batch_size": cell.batch_size, "input_len": cell.input_len, "output_len": cell.output_len,
        "workload": cell.workload, "workload_json": stable_dump(m.workload_of(cell.workload)), "env": cell.env,
        "device": job.device,
        "warmup": m.measure.warmup, "group_tries": job.tries,
        "repeats": None if m.measure.repeats == "auto" else m.measure.repeats,   # a stored cell: as many as it made
        "mode": cell.mode, "request_rate": cell.request_rate, "load": load_kind(m, cell),
        "endpoint": m.model_entry(cell.model).endpoint if cell.mode == "serve" else None,
        "search_id": cell.cell_id if cell.search else None,
        "status": status, "reason": scrub_paths(reason), "attempt": attempt,
    }
    notes: list[str] = []
    missing: dict[str, str] = {}
    if loaded is not None:
        f = loaded.facts
        row |= {"load_s": loaded.load_s, "load_peak_mem_bytes": loaded.load_peak_mem_bytes,
                "mem_source": loaded.mem_source, "versions": f.versions, "engine_args": _scrubbed(f.engine_args),
                "kv_budget_bytes": f.kv_budget_bytes, "batch_mode": f.batch_mode,
                "engine_deviation": f.engine_deviation,
                "model_fingerprint": loaded.model_fingerprint,
                "host": loaded.host.model_dump(mode="json") if loaded.host is not None else None,
                "env_facts": loaded.env.model_dump(mode="json") if loaded.env is not None else None}
        notes, missing = list(f.notes), dict(loaded.missing)
    if record is not None:
        row |= record.model_dump(exclude={"notes", "missing"})
        notes, missing = notes + record.notes, missing | record.missing
    if loaded is not None or record is not None:
        row |= {"notes": notes, "missing": missing}
    row |= columns
    unknown = set(row) - set(CELLS_SCHEMA.names)
    if unknown:
        raise KeyError(f"not in the cells schema: {sorted(unknown)}")
    return row


def _scrubbed(value: Any) -> Any:
    """`value` with this machine's paths out of every key and text (a value JSON cannot hold as it is,
    a Path say, as its text)."""
    if isinstance(value, dict):
        return {scrub_paths(str(k)): _scrubbed(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_scrubbed(v) for v in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return scrub_paths(str(value))
