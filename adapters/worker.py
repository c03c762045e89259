"""The child process that runs one engine group: `python -m adapters.worker SPEC.json OUT_DIR`.

It runs in the framework's own interpreter, so it imports nothing from the orchestrator, only
this package, numpy, pydantic and psutil. It loads the engine once, then for each cell runs the
warm-up and timed batches and the logprob capture, and writes for each cell `<cell_id>.json` (the
measurements) and `<cell_id>.npz` (the logprob rows). Progress goes to `events.jsonl`, one line per
event, so the parent can tell which cell was running when a crash or a hang happened. Serve cells
(`adapters.serve_worker`) start the engine's server here instead of loading the engine.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, TypeVar

import numpy as np

from adapters import ADAPTERS
from adapters.base import Adapter, LoadSpec, ModelSpec, TokenScores, Unsupported
from adapters.trackers import MemoryTracker, latency_stats


class Events:
    def __init__(self, out_dir: Path):
        self.file = open(out_dir / "events.jsonl", "a", buffering=1)

    def emit(self, event: str, **fields) -> None:
        self.file.write(json.dumps({"event": event, "t": time.time(), **fields}, default=str) + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())


def _chunks(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _logprob_rows(scores: list[TokenScores], prompts: list[list[int]], kind: str, repeat: int,
                  first_index: int, rows: dict[str, list]) -> None:
    for j, (s, prompt) in enumerate(zip(scores, prompts)):
        n = len(s)
        # a prompt row scores token i+1 of the prompt; a generation row the j-th new token
        start = 1 if kind == "prompt" else len(prompt)
        rows["kind"].append(np.full(n, 0 if kind == "prompt" else 1, np.int8))
        rows["repeat"].append(np.full(n, repeat, np.int16))
        rows["prompt_index"].append(np.full(n, first_index + j, np.int32))
        rows["position"].append(np.arange(start, start + n, dtype=np.int32))
        rows["token_id"].append(s.token_ids.astype(np.int32))
        rows["logprob"].append(s.logprobs.astype(np.float32))
        rows["topk_ids"].append(s.topk_ids.astype(np.int32))
        rows["topk_logprobs"].append(s.topk_logprobs.astype(np.float32))


T = TypeVar("T")
LOGPROB_FIELDS = ("kind", "repeat", "prompt_index", "position", "token_id", "logprob", "topk_ids", "topk_logprobs")


def logprob_arrays(rows: dict[str, list]) -> dict[str, np.ndarray]:
    return {n: np.concatenate(parts) if parts else np.zeros(0) for n, parts in rows.items()}


def capture_logprobs(adapter: Adapter, scoring: dict, batch_size: int) -> dict[str, np.ndarray]:
    """Teacher-forced and greedy logprobs of the scoring prompts, at the cell's batch size."""
    rows: dict[str, list] = {n: [] for n in LOGPROB_FIELDS}
    prompts = scoring["prompts"]
    for repeat in range(scoring["repeats"]):
        for first, chunk in zip(range(0, len(prompts), batch_size), _chunks(prompts, batch_size)):
            _logprob_rows(adapter.score(chunk, scoring["top_k"]), chunk, "prompt", repeat, first, rows)
            greedy = adapter.greedy(chunk, scoring["greedy_tokens"], scoring["top_k"])
            _logprob_rows(greedy, chunk, "generation", repeat, first, rows)
    return logprob_arrays(rows)


def run_cell(adapter: Adapter, cell: dict, scoring: dict | None, memory: MemoryTracker) -> tuple[dict, dict]:
    prompts = cell["timing_prompts"]
    batches = list(_chunks(prompts, cell["batch_size"]))
    for batch in batches[: cell["warmup"]]:
        adapter.generate(batch, cell["output_len"], cell["ignore_eos"])
    memory.reset_peak()
    timed = [adapter.generate(b, cell["output_len"], cell["ignore_eos"])
             for b in batches[cell["warmup"]: cell["warmup"] + cell["repeats"]]]
    record = latency_stats(timed)
    record["peak_mem_bytes"] = memory.peak()
    logprobs = {}
    if scoring:
        try:
            logprobs = capture_logprobs(adapter, scoring, cell["batch_size"])
        except Unsupported as err:  # e.g. a KV-reuse flag that forbids full logits: keep the timings
            record["capture_skipped"] = str(err)
    return record, logprobs


def _missing_modules(cls: type[Adapter]) -> list[str]:
    return [m for m in cls.requires_modules if importlib.util.find_spec(m) is None]


def load_or_report(load: Callable[[], T], events: Events, cell_ids: list[str]) -> T | None:
    """What load() returns, or None once an event says why none of the group's cells can run."""
    try:
        return load()
    except Unsupported as err:
        events.emit("unsupported", cells=cell_ids, reason=str(err))
    except Exception as err:
        events.emit("load_failed", cells=cell_ids, reason=f"{type(err).__name__}: {err}",
                    traceback=traceback.format_exc()[-4000:])
    return None


def run_cells(cells: list[dict], measure: Callable[[dict], tuple[dict, dict]], events: Events, out: Path,
              check: Callable[[], None] = lambda: None) -> None:
    """Each cell in turn: its record and logprob rows on disk, or in the events why not. `check` runs
    after each cell (and before a failure is blamed on it): it may end the worker, as serve mode's does
    when its server has died."""
    for cell in cells:
        cid = cell["cell_id"]
        events.emit("cell_start", cell_id=cid)
        started = time.perf_counter()
        try:
            record, logprobs = measure(cell)
        except Unsupported as err:
            events.emit("cell_unsupported", cell_id=cid, reason=str(err))
            continue
        except Exception as err:
            check()
            events.emit("cell_failed", cell_id=cid, reason=f"{type(err).__name__}: {err}",
                        traceback=traceback.format_exc()[-4000:])
            continue
        check()
        record["duration_s"] = time.perf_counter() - started
        np.savez(out / f"{cid}.npz", **logprobs)
        (out / f"{cid}.json").write_text(json.dumps(record))
        events.emit("cell_done", cell_id=cid)


def main(spec_path: str, out_dir: str) -> int:
    out = Path(out_dir)
    spec = json.loads(Path(spec_path).read_text())
    events = Events(out)
    events.emit("start", pid=os.getpid(), python=sys.executable)
    load = spec["load"]
    cls = ADAPTERS[load["framework"]]
    cell_ids = [c["cell_id"] for c in spec["cells"]]
    serve = spec.get("mode") == "serve"
    endpoint = serve and spec["serve"]["endpoint"]   # someone else's server: no engine runs here

    missing = [] if endpoint else _missing_modules(cls)
    if missing:
        hint = f"; create it with: {cls.install_hint}" if cls.install_hint else ""
        events.emit("unsupported", cells=cell_ids,
                    reason=f"{cls.name} environment not installed in this interpreter "
                           f"(missing: {', '.join(missing)}){hint}")
        return 0
    adapter = cls()
    load_spec = LoadSpec(**{**load, "model": ModelSpec(**load["model"])})
    reason = None if endpoint else adapter.check(load_spec)
    if reason:
        events.emit("unsupported", cells=cell_ids, reason=reason)
        return 0
    if serve:
        from adapters.serve_worker import serve_group

        return serve_group(spec, adapter, load_spec, events, out)

    memory = MemoryTracker(load_spec.device).start()
    t0 = time.perf_counter()
    info = load_or_report(lambda: adapter.load(load_spec), events, cell_ids)
    if info is None:
        return 0
    load_s = time.perf_counter() - t0
    memory.extra_pids = info.memory_pids
    events.emit("loaded", load_s=load_s, load_peak_mem_bytes=memory.peak(), mem_source=memory.source,
                info=info.__dict__)

    run_cells(spec["cells"], lambda cell: run_cell(adapter, cell, spec.get("scoring"), memory), events, out)
    adapter.close()
    memory.stop()
    events.emit("end")
    return 0


def _exit_now(code: int) -> None:
    """Exit without the interpreter's teardown, which after torch takes 1-2 s of the group's time for
    nothing: every result is on disk (files closed, events fsynced) and adapter.close() has stopped the
    engine. (Helpers such as multiprocessing's resource tracker notice this process is gone, clean up
    and exit by themselves, as after a normal exit.)"""
    sys.stdout.flush()
    sys.stderr.flush()
    with contextlib.suppress(OSError, AttributeError):   # and C stdio buffers (engines' own output)
        ctypes.CDLL(None).fflush(None)
    os._exit(code)


if __name__ == "__main__":
    _exit_now(main(sys.argv[1], sys.argv[2]))
