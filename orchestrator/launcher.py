"""Runs one engine group in a child interpreter and turns whatever happens into one row per cell.

The child (`python -m adapters.worker`) gets its own process group and dies with its parent, so a
segfault, an OOM kill, a hang or leaked GPU memory ends only that child. A crash or a timeout in
one cell becomes that cell's row, and a fresh child is started for the cells still to run.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

import adapters
from adapters.contract import (LOGPROB_COLUMNS, LOGPROB_KINDS, PROBES, TASK_OUTPUTS, CellDone, CellFailed, CellRecord,
                               CellSpec, CellStart, CellUnsupported, GroupSpec, GroupUnsupported, Loaded, LoadFailed,
                               LoadSpec, ModelSpec, SamplerSettings, SamplingSpec, ScoringSpec, ServeSpec, TaskError,
                               parse_event)
from adapters.server_process import die_with_parent
from orchestrator.cells import Cell, EngineGroup
from orchestrator.matrix import Matrix, stable_dump
from orchestrator import task_sets
from orchestrator.store import LOGPROBS_SCHEMA, SAMPLES_SCHEMA, TASKS_SCHEMA
from orchestrator.task_metrics import task_rows
from orchestrator.chat import ChatRenderer, NoChatTemplate
from orchestrator.workload import Tokenizer, scoring_prompts, text_prompts, timing_requests

PROJECT_ROOT = Path(adapters.__file__).resolve().parent.parent
POLL_S = 0.05
STDERR_TAIL_CHARS = 2000


@dataclass
class GroupJob:
    """What a Ray task needs to run one engine group (picklable)."""

    run_id: str
    group: EngineGroup
    matrix: Matrix
    device: str
    python: str
    cache_dir: str
    tries: int = 0          # times the scheduler has sent this group to Ray
    ledger: Any = None      # work stealing (orchestrator/ledger.py): the driver's ledger actor, and this part's id
    part_id: str = ""


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
        return self._replace(**{k: _ipc(t) for k, t in self._tables()})

    def unpacked(self) -> CellResult:
        """The driver's side of packed(): the tables again (zero-copy over the received buffers)."""
        return self._replace(**{k: pa.ipc.open_stream(b).read_all() for k, b in self._tables()})

    def _tables(self) -> list[tuple[str, Any]]:
        return [(k, v) for k, v in zip(self._fields[1:], self[1:]) if v is not None]


def _ipc(table: pa.Table) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _own_group_dying_with_parent() -> None:
    os.setsid()          # its own process group: a kill of the group takes the engine's helpers too
    die_with_parent()    # and it must not outlive its Ray worker


def load_kind(m: Matrix, cell: Cell) -> str:
    """batch (an offline static batch), closed (a served closed loop), or the arrival of a served rate."""
    if cell.mode in ("offline", "stream"):
        return "batch" if cell.mode == "offline" else "stream"
    if cell.search:
        return f"search {m.serve.search.variable}"
    return "closed" if math.isinf(cell.request_rate) else m.serve.arrival


def base_row(job: GroupJob, cell: Cell) -> dict:
    m = job.matrix
    return {
        "run_id": job.run_id, "cell_id": cell.cell_id, "engine_key": cell.engine_key,
        "framework": cell.framework, "model": cell.model, "quantization": cell.quantization,
        "flags": cell.flags, "flags_json": json.dumps(cell.options, sort_keys=True),
        "batch_size": cell.batch_size, "input_len": cell.input_len, "output_len": cell.output_len,
        "workload": cell.workload, "workload_json": json.dumps(stable_dump(m.workload_of(cell.workload)), sort_keys=True),
        "device": job.device,
        "warmup": m.measure.warmup, "group_tries": job.tries,
        "repeats": None if m.measure.repeats == "auto" else m.measure.repeats,   # a stored cell: as many as it made
        "mode": cell.mode, "request_rate": cell.request_rate, "load": load_kind(m, cell),
        "endpoint": m.model_entry(cell.model).endpoint if cell.mode == "serve" else None,
        "search_id": cell.cell_id if cell.search else None,
    }


def _resolve_source(source: str, cache_dir: str) -> str:
    if source.startswith("builtin:"):
        from orchestrator.tiny_model import resolve_model_source

        return resolve_model_source(source, Path(cache_dir))
    return source


def _tokenizer_source(job: GroupJob) -> str:
    entry = job.matrix.model_entry(job.group.model)
    return _resolve_source(entry.tokenizer or entry.source, job.cache_dir)


def build_spec(job: GroupJob, cells: list[Cell], tok: Tokenizer, tasks: task_sets.Loaded) -> GroupSpec:
    m, g = job.matrix, job.group
    entry = m.model_entry(g.model)
    source = _resolve_source(entry.source, job.cache_dir)
    serve = g.mode == "serve"
    api = adapters.ADAPTERS[g.framework].server_api if serve else None
    as_text = serve and not api.prompt_ids   # a server that takes text only gets the prompts' text
    auto = m.measure.auto_repeats if m.measure.repeats == "auto" else None
    repeats = auto.max_repeats if auto else m.measure.repeats   # prompts are prepared for the most
    # a chat workload: the model's own template renders the messages (NoChatTemplate: unsupported rows)
    chat = ChatRenderer(_tokenizer_source(job), entry.trust_remote_code) if _chat(m, cells) else None
    spec_cells, longest = [], 0
    for c in cells:
        per_run = {"serve": m.serve.requests, "stream": m.measure.stream_requests}.get(g.mode, c.batch_size)
        n = m.measure.warmup * c.batch_size + repeats * per_run
        # a drawn or dataset workload: the cell's input_len / output_len cap (datasets) or name (drawn) lengths
        w = m.workload_of(c.workload)
        req = timing_requests(w, tok, n, _cap(w, "input_lengths", c.input_len), _cap(w, "output_lengths", c.output_len),
                              g.mode, chat)
        prompts, texts = req.prompts, None
        if as_text and not getattr(w, "chat", False):
            prompts, texts = text_prompts(tok, prompts)
        outs = req.output_lens or [c.output_len] * len(prompts)
        longest = max([longest] + [len(p) + o for p, o in zip(prompts, outs)])
        spec_cells.append(CellSpec(
            cell_id=c.cell_id, batch_size=c.batch_size, output_len=c.output_len, warmup=m.measure.warmup,
            repeats=repeats, auto=auto, ignore_eos=m.measure.ignore_eos, timing_prompts=prompts, timing_texts=texts,
            timing_messages=req.messages if serve else None,
            request_rate=None if c.request_rate is None or math.isinf(c.request_rate) else c.request_rate,
            output_lens=req.output_lens, follows=req.follows, think_time_s=req.think_time_s,
            stream_requests=per_run if g.mode == "stream" else 0,
            notes=([f"workload: {c.workload}"] if c.workload else []) + req.notes))
    scoring = scoring_prompts(m.measure, tok)
    task_specs = task_sets.task_specs(tasks, tok, _tokenizer_source(job), entry.trust_remote_code,
                                      max_length=max(2048, m.measure.scoring_len + m.measure.greedy_tokens))
    load = LoadSpec(
        framework=g.framework, quantization=g.quantization, options=g.options, device=job.device,
        gpus=0 if job.device == "cpu" else max(1, int(g.options.get("tensor_parallel_size", 1))),
        cache_dir=str(Path(job.cache_dir) / "engines"), seed=0,
        max_running=g.cells[0].batch_size if g.mode == "stream" else None,
        context_len=max([longest] + [m.measure.scoring_len + max(
            m.measure.greedy_tokens, m.measure.sampling.tokens if m.measure.sampling else 0)]),
        model=ModelSpec(name=g.model, source=source, trust_remote_code=entry.trust_remote_code, revision=entry.revision))
    return GroupSpec(
        mode=g.mode, load=load, cells=spec_cells,
        scoring=None if serve and not m.serve.capture_logprobs else ScoringSpec(
            prompts=scoring, texts=[tok.decode(p) for p in scoring] if as_text else None,
            top_k=m.measure.top_k, greedy_tokens=m.measure.greedy_tokens, repeats=m.measure.score_repeats),
        serve=None if not serve else ServeSpec(
            **m.serve.model_dump(), endpoint=entry.endpoint, api_key_env=entry.api_key_env,
            # one seed per server (arrivals, request seeds): the first cell's workload's, where workloads differ
            startup_timeout_s=0.95 * m.run.load_timeout_s, seed=getattr(m.workload_of(cells[0].workload), "seed", 0)),
        tasks=task_specs, sampling=_sampling_spec(m, scoring))


def _cap(workload, field: str, axis_value: int) -> int:
    """The most tokens a request may have: a drawn distribution's upper end, else the axis value."""
    dist = getattr(workload, field, None)
    return dist.upper if dist is not None else axis_value


def _sampling_spec(m: Matrix, scoring: list[list[int]]) -> SamplingSpec | None:
    s = m.measure.sampling
    if s is None:
        return None
    return SamplingSpec(prompts=scoring[: s.prompts or len(scoring)], seeds=s.seeds, seed_offset=s.seed_offset,
                        tokens=s.tokens, repeats=s.repeats, next_top_k=s.next_top_k,
                        settings=SamplerSettings(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, min_p=s.min_p))


def _task_table(run_id: str, cell_id: str, path: Path, tasks: dict, tok: Tokenizer) -> tuple[pa.Table | None, dict]:
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


def _logprob_table(run_id: str, cell_id: str, npz: Path) -> pa.Table | None:
    """A worker's logprob rows (adapters.contract.LOGPROB_COLUMNS) as the store's table."""
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


def _sample_table(run_id: str, cell_id: str, npz: Path) -> pa.Table | None:
    """A worker's samples (adapters.contract.SAMPLE_COLUMNS) as the store's table."""
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


def _read_events(path: Path, offset: int) -> tuple[list, int]:
    if not path.exists():
        return [], offset
    with open(path) as f:
        f.seek(offset)
        chunk = f.read()
    # only whole lines; a partial last line is read again next time
    whole, _, _ = chunk.rpartition("\n")
    events = [parse_event(line) for line in whole.splitlines() if line.strip()]
    return events, offset + len(whole) + (1 if whole else 0)


def _tail(path: Path) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-STDERR_TAIL_CHARS:].strip()


def scrub_paths(text: str | None) -> str | None:
    """Reasons quote engine output and tracebacks: keep this machine's paths out of shared results."""
    if not text:
        return text
    for path, name in ((tempfile.gettempdir(), "<tmp>"), (str(PROJECT_ROOT), "<project>"),
                       (sys.prefix, "<python>"), (os.path.expanduser("~"), "~")):
        text = text.replace(path, name)
    return text


def _describe_exit(code: int) -> str:
    if code < 0:
        name = signal.Signals(-code).name
        hint = " (the kernel's OOM killer sends this when memory runs out)" if -code == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exited with code {code}"


def _chat(m: Matrix, cells: list[Cell]) -> bool:
    """Whether any of these cells runs a chat workload (the model's chat template, /v1/chat/completions)."""
    return any(getattr(m.workload_of(c.workload), "chat", False) for c in cells)


def unsupported_reason(job: GroupJob, python: str) -> str | None:
    """What rules a group out before any process starts: the engine's declared support, the env."""
    cls, g = adapters.ADAPTERS[job.group.framework], job.group
    endpoint = g.mode == "serve" and job.matrix.model_entry(g.model).endpoint
    if g.mode == "serve" and cls.server_api is None:
        return f"{g.framework} has no OpenAI-compatible server to run serve cells with" + (
            f": {cls.no_server_reason}" if cls.no_server_reason else "")
    if g.mode == "serve" and _chat(job.matrix, g.cells) and not cls.server_api.chat:
        return f"{g.framework}'s server is not driven through /v1/chat/completions here (chat workloads: vllm, llamacpp)"
    if g.mode == "stream" and not cls.streams:
        return f"{g.framework} has no stream mode: {cls.no_stream_reason}"
    if endpoint:
        return None   # someone else's server: nothing of the engine runs here
    if g.quantization not in cls.quantizations:
        return f"{g.framework} does not run quantization {g.quantization} (it runs: {', '.join(cls.quantizations)})"
    if cls.needs_cuda and job.device != "cuda":
        return f"{g.framework} needs CUDA; this run's device is {job.device}"
    if not Path(python).exists() and shutil.which(python) is None:
        hint = f"; create it with: {cls.install_hint}" if cls.install_hint else ""
        return f"{g.framework} environment not installed: its interpreter (run.python.{g.framework}) does not exist{hint}"
    return None


def run_group(job: GroupJob) -> list[CellResult]:
    """Run every cell of the group; returns exactly one row per cell, but for the cells the driver moved to
    another node while this part ran (work stealing: their rows come from there)."""
    if job.ledger is None:
        return _run_group(job, None)
    from orchestrator.ledger import PartChannel

    channel = PartChannel(job.ledger, job.part_id)
    try:
        return _run_group(job, channel)
    finally:
        channel.close()
        shutil.rmtree(channel.claims_dir, ignore_errors=True)


def _run_group(job: GroupJob, channel) -> list[CellResult]:
    by_id = {c.cell_id: c for c in job.group.cells}
    results: dict[str, CellResult] = {}
    probes: list[CellResult] = []      # SLO-search probes: rows of their own, stored before their search's
    remaining = list(job.group.cells)
    gone = channel.withdrawn if channel else set()   # cells given up to another node: not ours to row
    python = job.python or sys.executable
    attempt = 0

    def finish(cell_id: str, status: str, reason: str | None = None, extra: dict | None = None, lp=None, tasks=None,
               samples=None):
        row = base_row(job, by_id[cell_id]) | {"status": status, "reason": scrub_paths(reason), "attempt": attempt}
        if by_id[cell_id].search:   # whatever became of the search, the probes it made are rows
            probes.extend(probe_rows(job, by_id[cell_id], work / f"{cell_id}.probes.json", loaded, attempt))
        results[cell_id] = CellResult(row | (extra or {}), lp, tasks, samples)

    work, loaded = Path(tempfile.gettempdir()) / "bench-no-group", None   # before the first worker: no probes
    reason = unsupported_reason(job, python)
    if reason:
        for c in remaining:
            finish(c.cell_id, "unsupported", reason)
        return probes + [results[c.cell_id] for c in job.group.cells]

    try:
        entry = job.matrix.model_entry(job.group.model)
        tok = Tokenizer(_tokenizer_source(job), entry.trust_remote_code)
        tasks = task_sets.load_tasks(job.matrix.tasks)
        spec_all = build_spec(job, remaining, tok, tasks)
        if channel:
            spec_all.claims_dir = channel.claims_dir
    except NoChatTemplate as err:  # known only here, where a hub model's tokenizer is fetched
        for c in remaining:
            finish(c.cell_id, "unsupported", str(err))
        return probes + [results[c.cell_id] for c in job.group.cells]
    except Exception as err:  # a bad dataset, a missing model dir: every cell fails, with the reason
        for c in remaining:
            finish(c.cell_id, "failed", f"preparing prompts: {type(err).__name__}: {err}")
        return probes + [results[c.cell_id] for c in job.group.cells]
    m = job.matrix

    while remaining:
        attempt += 1
        work = Path(tempfile.mkdtemp(prefix="bench-group-"))
        ids = {c.cell_id for c in remaining} - gone
        spec = spec_all.model_copy(update={"cells": [s for s in spec_all.cells if s.cell_id in ids]})
        (work / "spec.json").write_text(spec.model_dump_json())
        log = open(work / "output.log", "wb")
        env = os.environ | {"PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.Popen([python, "-m", "adapters.worker", str(work / "spec.json"), str(work)],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=work, env=env, preexec_fn=_own_group_dying_with_parent)
        current: str | None = None
        loaded = None

        def handle(ev) -> None:
            nonlocal current, loaded
            if isinstance(ev, Loaded):
                loaded = ev
                if channel:
                    channel.report("load", ev.load_s or 0.0)
            elif isinstance(ev, CellStart):
                current = ev.cell_id
                if channel:
                    channel.report("start", time.time())
            elif isinstance(ev, CellDone):
                cid = ev.cell_id
                record = CellRecord.model_validate_json((work / f"{cid}.json").read_text())
                if channel:
                    channel.report("done", record.duration_s or 0.0)
                task_table, not_run = _task_table(job.run_id, cid, work / f"{cid}.tasks.json", tasks, tok)
                record.missing.update(not_run)
                finish(cid, "ok", extra=_measured(loaded, record), lp=_logprob_table(job.run_id, cid, work / f"{cid}.npz"),
                       tasks=task_table, samples=_sample_table(job.run_id, cid, work / f"{cid}.samples.npz"))
                current = None
            elif isinstance(ev, (CellFailed, CellUnsupported)):
                if channel:
                    channel.report("done", 0.0)
                finish(ev.cell_id, "failed" if isinstance(ev, CellFailed) else "unsupported",
                       _with_traceback(ev), extra=_load_facts(loaded))
                current = None
            elif isinstance(ev, (GroupUnsupported, LoadFailed)):
                for cid in ev.cells:
                    finish(cid, "unsupported" if isinstance(ev, GroupUnsupported) else "failed", _with_traceback(ev))

        offset, timed_out = 0, False
        deadline = time.monotonic() + m.run.load_timeout_s
        while True:
            exited = proc.poll() is not None  # read the events after checking, so none are missed
            events, offset = _read_events(work / "events.jsonl", offset)
            for ev in events:
                handle(ev)
                if isinstance(ev, CellStart):
                    deadline = time.monotonic() + m.run.cell_timeout_s
            if exited:
                break
            if channel:
                channel.poll()
            if time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                timed_out = True
                break
            _sleep_unless_exits(proc, POLL_S)
        log.close()
        tail = _tail(work / "output.log")
        pending = [c for c in remaining if c.cell_id not in results and c.cell_id not in gone]
        if timed_out:
            what = f"cell timeout {m.run.cell_timeout_s:g}s" if current else f"load timeout {m.run.load_timeout_s:g}s"
            victims = [current] if current else [c.cell_id for c in pending]
            for cid in victims:
                finish(cid, "timeout", f"killed after the {what}; last output:\n{tail}", extra=_load_facts(loaded))
        elif pending:
            how = _describe_exit(proc.returncode)
            victims = [current] if current else [c.cell_id for c in pending]
            where = "while running this cell" if current else ("before any cell ran" if not loaded else "between cells")
            for cid in victims:
                finish(cid, "crashed", f"engine process {how} {where}; last output:\n{tail}", extra=_load_facts(loaded))
        shutil.rmtree(work, ignore_errors=True)
        remaining = [c for c in remaining if c.cell_id not in results and c.cell_id not in gone]
    return probes + [results[c.cell_id] for c in job.group.cells if c.cell_id not in gone]


def _sleep_unless_exits(proc: subprocess.Popen, seconds: float) -> None:
    """Sleep, but wake as the child exits: the group's end is seen at once, not up to POLL_S later.
    One wake-up per poll either way (Popen.wait(timeout) would poll ever faster while an engine is timed)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):   # not Linux >= 5.3, or the child is gone already
        time.sleep(seconds)
        return
    try:
        select.select([fd], [], [], seconds)
    finally:
        os.close(fd)


def probe_id(search_id: str, probe: int) -> str:
    return hashlib.sha256(f"{search_id}/probe/{probe}".encode()).hexdigest()[:16]


def probe_rows(job: GroupJob, cell: Cell, path: Path, loaded: Loaded | None, attempt: int) -> list[CellResult]:
    """An SLO search's probes (adapters.slo_search) as rows: each at its own load point, named by the
    search (search_id) and its number; their outputs were not captured (the search's row has them)."""
    if not path.exists():
        return []
    rows = []
    for p in PROBES.validate_json(path.read_bytes()):
        closed = p.rate is None
        rec = p.record
        rec.missing["logprobs"] = "a search probe: the outputs are captured once, on the search's own row"
        rows.append(CellResult(base_row(job, cell) | _measured(loaded, rec) | {
            "cell_id": probe_id(cell.cell_id, rec.search_probe), "status": "ok", "reason": None, "attempt": attempt,
            "batch_size": p.concurrency, "request_rate": math.inf if closed else p.rate,
            "load": "closed" if closed else job.matrix.serve.arrival}))
    return rows


def _with_traceback(ev) -> str:
    return ev.reason + (f"\n{ev.traceback}" if getattr(ev, "traceback", None) else "")


def _load_facts(loaded: Loaded | None) -> dict:
    if loaded is None:
        return {}
    f = loaded.facts
    return {"load_s": loaded.load_s, "load_peak_mem_bytes": loaded.load_peak_mem_bytes,
            "mem_source": loaded.mem_source, "versions": json.dumps(f.versions, sort_keys=True),
            "engine_args": scrub_paths(json.dumps(f.engine_args, sort_keys=True, default=str)),
            "kv_budget_bytes": f.kv_budget_bytes, "batch_mode": f.batch_mode, "notes": json.dumps(f.notes),
            "model_fingerprint": loaded.model_fingerprint, "host": json.dumps(loaded.host, sort_keys=True),
            "missing": json.dumps(loaded.missing, sort_keys=True)}


def _measured(loaded: Loaded | None, record: CellRecord) -> dict:
    facts = _load_facts(loaded)
    values = record.model_dump(exclude={"notes", "missing"})
    notes = (loaded.facts.notes if loaded else []) + record.notes
    missing = (loaded.missing if loaded else {}) | record.missing
    return facts | values | {"notes": json.dumps(notes), "missing": json.dumps(missing, sort_keys=True)}
