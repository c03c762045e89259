"""Runs one engine group in a child interpreter and turns whatever happens into one row per cell.

The child (`python -m adapters.worker`) gets its own process group and dies with its parent, so a
segfault, an OOM kill, a hang or leaked GPU memory ends only that child. A crash or a timeout in
one cell becomes that cell's row, and a fresh child is started for the cells still to run. When a
child ends, however it ends, its whole process group ends with it (the engine's own processes: vLLM's
engine core and workers, a server), before its cells' rows go back to the driver.
"""

from __future__ import annotations

import dataclasses
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from adapters.contract.events import (
    CellDone,
    CellFailed,
    CellStart,
    CellUnsupported,
    GroupUnsupported,
    Loaded,
    LoadFailed,
    PartReport,
    TurnDone,
    TurnWait,
    parse_event,
)
from adapters.contract.processes import die_with_parent
from adapters.contract.records import NO_TIMING_TWIN, CellRecord
from adapters.contract.specs import GroupSpec
from orchestrator.execution.engine_child.prompts import Tokenizer
from orchestrator.execution.engine_child.rows import (
    CellResult,
    cell_row,
    probe_rows,
    read_logprob_rows,
    read_sample_rows,
    read_task_rows,
    with_traceback,
)
from orchestrator.execution.engine_child.spec import (
    PROJECT_ROOT,
    GroupJob,
    build_spec,
    tokenizer_source,
    unsupported_reason,
)
from orchestrator.inputs import task_sets
from orchestrator.inputs.chat import NoChatTemplate
from orchestrator.matrix.cells import pair_key

POLL_S = 0.05


STDERR_TAIL_CHARS = 2000


def _start_worker(job: GroupJob, python: str, work: Path, log, stdin) -> subprocess.Popen:
    """`python -m adapters.worker work/spec.json work`, in its own process group that dies with this process,
    the project importable, the job's env variables set, its output into `log`."""
    env = os.environ | job.env_vars | {"PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([python, "-m", "adapters.worker", str(work / "spec.json"), str(work)], stdout=log,
                            stderr=subprocess.STDOUT, stdin=stdin, cwd=work, env=env,
                            preexec_fn=_own_group_dying_with_parent)


def _own_group_dying_with_parent() -> None:
    os.setsid()          # its own process group: a kill of the group takes the engine's helpers too
    die_with_parent()    # and it must not outlive its Ray worker


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


def _describe_exit(code: int) -> str:
    if code < 0:
        name = signal.Signals(-code).name
        hint = " (the kernel's OOM killer sends this when memory runs out)" if -code == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exited with code {code}"


class Floor:
    """An env pair's turns on one node: one phase of engine work at a time (a load, a cell's warm-up, one timed
    repeat, a cell's logprobs, samples and tasks), and the timed repeats of each pair of cells in ABBA order:
    a0 b0 b1 a1 a2 b2 ..., so slow drift of the host falls on both sides alike. A side whose cell has its row
    (done, failed, crashed) waits for nothing more of it, so the other goes on alone."""

    def __init__(self, tokens: dict[str, tuple]):
        self.tokens = tokens                    # cell_id -> what its pair shares (cells of both sides)
        self.lock = threading.Lock()
        self.holder: tuple[str, TurnWait] | None = None
        self.done: dict[tuple, int] = {}        # (token, side) -> timed repeats ended
        self.over: set[tuple] = set()           # (token, side) whose cell has its row

    def take(self, side: str, ask: TurnWait) -> bool:
        with self.lock:
            if self.holder is not None:
                return False
            token = self.tokens.get(ask.cell_id or "")
            if ask.phase == "timed" and token is not None and ask.repeat is not None:
                other = "b" if side == "a" else "a"
                first = ("a", "b")[ask.repeat % 2]
                need = ask.repeat + (first == other)
                if (token, other) not in self.over and self.done.get((token, other), 0) < need:
                    return False
            self.holder = (side, ask)
            return True

    def release(self, side: str) -> None:
        with self.lock:
            if self.holder is None or self.holder[0] != side:
                return
            ask = self.holder[1]
            token = self.tokens.get(ask.cell_id or "")
            if ask.phase == "timed" and token is not None:
                self.done[token, side] = self.done.get((token, side), 0) + 1
            self.holder = None

    def cell_over(self, side: str, cell_id: str) -> None:
        with self.lock:
            if cell_id in self.tokens:
                self.over.add((self.tokens[cell_id], side))


def _run_sides(sides: dict[str, GroupJob], tokens: dict[str, tuple]) -> dict[str, list[CellResult]]:
    """Two groups loaded side by side on this node (two children), each phase of work taking turns on one
    Floor; `tokens` says which cells of the two sides are a pair (their timed repeats in ABBA order)."""
    floor = Floor(tokens)
    results: dict[str, list[CellResult]] = {}

    def run(side: str) -> None:
        try:
            results[side] = _run_group(sides[side], None, floor, side)
        except Exception as err:   # never lose a side's rows: each cell says what went wrong
            why = f"pair supervisor failed: {type(err).__name__}: {err}"
            results[side] = [CellResult(cell_row(sides[side], c, "failed", why)) for c in sides[side].group.cells]
            floor.release(side)
            for c in sides[side].group.cells:
                floor.cell_over(side, c.cell_id)

    threads = [threading.Thread(target=run, args=(side,), daemon=True) for side in sides]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _run_pair(job: GroupJob) -> list[CellResult]:
    """An env pair: both engines loaded side by side, each phase of work taking turns."""
    sides = {"a": dataclasses.replace(job, twin=None),
             "b": dataclasses.replace(job.twin, board=job.board, tries=job.tries, part_id=job.part_id, twin=None)}
    keys = [{pair_key(c) for c in j.group.cells} for j in sides.values()]
    results = _run_sides(sides, {c.cell_id: pair_key(c) for j in sides.values() for c in j.group.cells
                                 if pair_key(c) in keys[0] & keys[1]})
    return results["a"] + results["b"]


# the twin's figures a paired cell's row carries (CellRecord.base_*), from the twin's row of its baseline cell
TWIN_FIGURES = ("output_tok_s_runs", "host_busy_runs", "gpu_busy_runs", "repeat_started_at", "repeat_ended_at")


def _run_timed_beside(job: GroupJob) -> list[CellResult]:
    """measure.paired_timing: the job's cells run as usual, its baseline's engine loaded beside it as a timing twin
    (warm-up and timed repeats only), each cell's timed repeats taking turns with its baseline cell's. The twin's
    rows are not stored (the baseline's own group gives the baseline's rows): what its repeats measured goes on
    the paired cell's row (base_*), or, where the twin's cell did not end ok, why not."""
    twin = dataclasses.replace(job.timing_twin, board=None, tries=job.tries, part_id=job.part_id)
    sides = {"a": dataclasses.replace(job, timing_twin=None), "b": twin}
    tokens = {c: ("timing", c) for c in job.timing_pairs} | {b: ("timing", c) for c, b in job.timing_pairs.items()}
    results = _run_sides(sides, tokens)
    base_rows = {r.row["cell_id"]: r.row for r in results["b"]}
    for r in results["a"]:
        base = base_rows.get(job.timing_pairs.get(r.row["cell_id"], ""))
        if base is None or r.row.get("status") != "ok":
            continue
        if base["status"] == "ok":
            r.row.update({"base_timing_cell": base["cell_id"]} | {f"base_{k}": base.get(k) for k in TWIN_FIGURES})
            for k in NO_TIMING_TWIN:   # measured now: the worker's null reasons go
                r.row.get("missing", {}).pop(k, None)
        else:
            r.row.setdefault("missing", {})["base_output_tok_s_runs"] = (
                f"the baseline's timing twin ({base['cell_id']}) ended {base['status']}: {base.get('reason')}")
    return results["a"]


def run_group(job: GroupJob) -> list[CellResult]:
    """Run every cell of the group; returns exactly one row per cell, but for the cells the driver moved to
    another node while this part ran (work stealing: their rows come from there). An env pair (`job.twin`)
    runs both groups here, interleaved."""
    if job.twin is not None:
        return _run_pair(job)
    if job.timing_twin is not None:
        return _run_timed_beside(job)
    if job.ledger is None:
        return _run_group(job, None)
    from orchestrator.execution.scheduling.ledger import PartChannel

    channel = PartChannel(job.ledger, job.part_id)
    try:
        return _run_group(job, channel)
    finally:
        channel.close()
        shutil.rmtree(channel.claims_dir, ignore_errors=True)


def _tell(job: GroupJob, what: str, cell_id: str | None = None, status: str | None = None) -> None:
    """A PartReport to the driver's progress board, fire and forget (none without a board; a board gone
    loses only the display, never a row)."""
    if job.board is None:
        return
    try:
        job.board.report.remote(PartReport(part=job.part_id, what=what, cell_id=cell_id, status=status, t=time.time()))
    except Exception:   # the board died with the driver's display: the rows still go back through Ray
        job.board = None


def _run_group(job: GroupJob, channel, floor: Floor | None = None, side: str = "") -> list[CellResult]:
    by_id = {c.cell_id: c for c in job.group.cells}
    results: dict[str, CellResult] = {}
    probes: list[CellResult] = []      # SLO-search probes: rows of their own, stored before their search's
    remaining = list(job.group.cells)
    gone = channel.withdrawn if channel else set()   # cells given up to another node: not ours to row
    python = job.python or sys.executable
    attempt = 0

    def finish(cell_id: str, status: str, reason: str | None = None, *, facts: bool = False,
               record: CellRecord | None = None, lp=None, tasks=None, samples=None):
        """The cell's row: with the engine's load facts where it ran on this loaded engine (`facts`)."""
        if by_id[cell_id].search:   # whatever became of the search, the probes it made are rows
            probes.extend(probe_rows(job, by_id[cell_id], work / f"{cell_id}.probes.json", loaded, attempt))
        row = cell_row(job, by_id[cell_id], status, reason, attempt=attempt, loaded=loaded if facts else None,
                       record=record)
        results[cell_id] = CellResult(row, lp, tasks, samples)
        if floor is not None:
            floor.cell_over(side, cell_id)
        _tell(job, "end", cell_id, status)

    work, loaded = Path(tempfile.gettempdir()) / "bench-no-group", None   # before the first worker: no probes
    reason = unsupported_reason(job, python)
    if reason:
        for c in remaining:
            finish(c.cell_id, "unsupported", reason)
        return probes + [results[c.cell_id] for c in job.group.cells]

    try:
        entry = job.matrix.model_entry(job.group.model)
        tok = Tokenizer(tokenizer_source(job), entry.trust_remote_code)
        tasks = task_sets.load_tasks(job.matrix.tasks)
        spec_all = build_spec(job, remaining, tok, tasks)
        if channel:
            spec_all.claims_dir = channel.claims_dir
        spec_all.turns = floor is not None and spec_all.mode != "serve"   # an env pair: take turns with the twin
        if job.timing_only:   # a timing twin: its cells' logprobs, samples and tasks are its own group's work
            spec_all = spec_all.model_copy(update={"scoring": None, "sampling": None, "tasks": []})
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
        proc = _start_worker(job, python, work, log, subprocess.PIPE if floor is not None else subprocess.DEVNULL)
        current: str | None = None
        loaded = None
        asked: TurnWait | None = None   # an env pair: the phase the child waits to start
        _tell(job, "loading")

        def handle(ev) -> None:
            nonlocal current, loaded, asked
            if isinstance(ev, TurnWait):
                asked = ev
            elif isinstance(ev, TurnDone):
                floor.release(side)
            elif isinstance(ev, Loaded):
                loaded = ev
                _tell(job, "loaded")
                if channel:
                    channel.report("load", ev.load_s or 0.0)
            elif isinstance(ev, CellStart):
                current = ev.cell_id
                _tell(job, "start", ev.cell_id)
                if channel:
                    channel.report("start", time.time())
            elif isinstance(ev, CellDone):
                cid = ev.cell_id
                record = CellRecord.model_validate_json((work / f"{cid}.json").read_text())
                if channel:
                    channel.report("done", record.duration_s or 0.0)
                task_table, not_run = read_task_rows(job.run_id, cid, work / f"{cid}.tasks.json", tasks, tok)
                record.missing.update(not_run)
                finish(cid, "ok", facts=True, record=record, lp=read_logprob_rows(job.run_id, cid, work / f"{cid}.npz"),
                       tasks=task_table, samples=read_sample_rows(job.run_id, cid, work / f"{cid}.samples.npz"))
                current = None
            elif isinstance(ev, (CellFailed, CellUnsupported)):
                if channel:
                    channel.report("done", 0.0)
                finish(ev.cell_id, "failed" if isinstance(ev, CellFailed) else "unsupported",
                       with_traceback(ev), facts=True)
                current = None
            elif isinstance(ev, (GroupUnsupported, LoadFailed)):
                for cid in ev.cells:
                    finish(cid, "unsupported" if isinstance(ev, GroupUnsupported) else "failed", with_traceback(ev))

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
            if asked is not None and floor.take(side, asked):
                try:
                    proc.stdin.write(b"go\n")
                    proc.stdin.flush()
                except OSError:   # the child is gone: its exit is seen next round
                    pass
                asked = None      # the wait for the other side's turns is not this cell's time
                deadline = max(deadline, time.monotonic() + (m.run.cell_timeout_s if current else m.run.load_timeout_s))
            if channel:
                channel.poll()
            if time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                timed_out = True
                break
            _sleep_unless_exits(proc, POLL_S)
        log.close()
        _end_group(proc.pid)
        if floor is not None:     # a child that ended holding the floor frees it
            floor.release(side)
            if proc.stdin:
                proc.stdin.close()
        tail = _tail(work / "output.log")
        pending = [c for c in remaining if c.cell_id not in results and c.cell_id not in gone]
        if timed_out:
            what = f"cell timeout {m.run.cell_timeout_s:g}s" if current else f"load timeout {m.run.load_timeout_s:g}s"
            victims = [current] if current else [c.cell_id for c in pending]
            for cid in victims:
                finish(cid, "timeout", f"killed after the {what}; last output:\n{tail}", facts=True)
        elif pending:
            how = _describe_exit(proc.returncode)
            victims = [current] if current else [c.cell_id for c in pending]
            where = "while running this cell" if current else ("before any cell ran" if not loaded else "between cells")
            for cid in victims:
                finish(cid, "crashed", f"engine process {how} {where}; last output:\n{tail}", facts=True)
        shutil.rmtree(work, ignore_errors=True)
        remaining = [c for c in remaining if c.cell_id not in results and c.cell_id not in gone]
    return probes + [results[c.cell_id] for c in job.group.cells if c.cell_id not in gone]


def run_child(job: GroupJob, spec: GroupSpec, timeout_s: float) -> tuple[Path, str | None]:
    """One engine child for a spec that runs no cell (the baseline's engine rescoring samples), waited for
    at most `timeout_s`, its process group ended after it: (its work dir, for the caller to read and remove;
    None, or why it did not finish: not supported, its load failed, it crashed or timed out, with its output's
    tail)."""
    work = Path(tempfile.mkdtemp(prefix="bench-child-"))
    (work / "spec.json").write_text(spec.model_dump_json())
    with open(work / "output.log", "wb") as log:
        proc = _start_worker(job, job.python or sys.executable, work, log, subprocess.DEVNULL)
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            timed_out = True
    _end_group(proc.pid)
    events, _ = _read_events(work / "events.jsonl", 0)
    said = [ev for ev in events if isinstance(ev, (GroupUnsupported, LoadFailed))]
    if said:
        return work, with_traceback(said[0])
    if proc.returncode or not any(ev.event == "end" for ev in events):
        how = f"killed after {timeout_s:g} s" if timed_out else _describe_exit(proc.returncode)
        return work, f"engine process {how}; last output:\n{_tail(work / 'output.log')}"
    return work, None


def _end_group(pgid: int, wait_s: float = 10.0) -> list[int]:
    """After the engine child ended (done, crashed, killed or timed out): SIGKILL what is left of its process
    group (vLLM's engine core and its workers, a server and its children: the engine child's own watchdog,
    adapters/contract/processes.py, does the same when the child ends, and this covers a child that died
    before it started one), and wait until each is gone, so the engine's memory is free before the next
    child loads and no engine process outlives its cells' rows. Returns the pids that were left."""
    import psutil

    left = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid:
                left.append(p)
        except (OSError, psutil.Error):
            pass
    if not left:
        return []
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
    deadline = time.monotonic() + wait_s
    for p in left:
        while time.monotonic() < deadline:
            try:
                if not p.is_running() or p.status() == psutil.STATUS_ZOMBIE:   # (a zombie: its parent reaps it)
                    break
            except psutil.Error:
                break
            time.sleep(0.02)
    return [p.pid for p in left]


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
