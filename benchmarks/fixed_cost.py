"""The fixed cost of one engine group, beyond the engine's own import and load, broken down.

For each engine (hf, llamacpp, vllm) it runs one real engine group (two cells of builtin:tiny, the
default `measure` section: a realistic logprob payload) through the real pipeline pieces:
`scheduler.init_ray`, a Ray task with the scheduler's options (`job_need(...).ray_options()`, and
the Ray options of the scheduler's own task, max_calls included), `launcher.run_group` (spec, child
interpreter, event polling, worker output -> Arrow), the rows back through Ray, and
`RunStore.write_cell` (Parquet). The groups run one after another in one Ray session, as the
groups of a run do. Nothing in the harness is changed for it: the task is this script's own copy of
`scheduler._group_task`, which takes the job as bytes (so its unpickling, and the imports that
brings, are timed apart from the worker's start) and wraps, in that Ray worker only, the launcher's
`subprocess.Popen`, `_read_events`, `measured` and `read_logprob_rows` with timers. The child's own
timestamps are the "t" of its events (adapters/worker/group.py), on the same wall clock.

Pieces (seconds, wall clock), one after the other from the submission to the Parquet files written,
so they add up to the total:
  Ray task start          submit -> the task's first line (a Ray worker: reused, or started for it)
  worker imports          `import orchestrator.execution.scheduling.scheduler` in that worker (0 in a reused one)
  job unpickling          the GroupJob (matrix, cells)
  spec (prompts)          the launcher until Popen: build_spec (tokenizer, timing and scoring prompts)
  child start             Popen -> the child's first event: interpreter start, `import adapters`, the spec
  engine import + load    the child's start -> loaded events (the engine's own; not in the goal)
  loaded -> first cell    the child, between the two events
  cells                   cell_start -> cell_done, every cell (the measurement itself; not in the goal)
  between cells           the child's gaps between one cell's done and the next cell's start
  child close             the last cell_done -> the end event (adapter.close(), the tracker stopped)
  child exit              the end event -> the launcher sees the process gone (interpreter exit, poll)
  launcher finish         -> the rows ready to go back (the last rows, the temp dir removed, Arrow IPC)
  hand-back via Ray       the task's rows ready (scheduler._run_on_node) -> ray.get returned and unpacked
  Parquet write           RunStore.write_cell, every row
  group overhead          the total minus engine import + load and cells: the goal, under 2 s
Off that path (the launcher does them while the child runs on): outputs -> Arrow (measured and
read_logprob_rows) and the event polling lag (mean, cell_done written -> seen). Per run, not per group:
ray.init, and `bench run` end to end (wall time minus the stored load_s and duration_s); a run's
pieces (CLI start, ray.init, compaction, exit ...) one by one, before/after: benchmarks/run_cost.py.

    .venv/bin/python benchmarks/fixed_cost.py                  # hf, llamacpp, vllm
    .venv/bin/python benchmarks/fixed_cost.py --engines hf,llamacpp --repeats 3
    .venv/bin/python benchmarks/fixed_cost.py --root /tmp/old-checkout   # measure another checkout
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _matrix(engine: str) -> dict:
    return {"name": f"fixed-{engine}", "models": {"tiny": "builtin:tiny"},
            "axes": {"framework": [engine], "model": ["tiny"], "quantization": ["fp32"], "batch_size": [1, 4],
                     "input_len": [32], "output_len": [16]},
            "run": {"cell_timeout_s": 900}}


def traced_group_task(job_blob: bytes):
    """scheduler._group_task, with timers around the launcher's pieces (this Ray worker only)."""
    t_enter = time.time()
    import orchestrator.execution.scheduling.scheduler  # the real task's module: what its worker imports
    t_imported = time.time()
    job = pickle.loads(job_blob)
    t_job = time.time()
    import subprocess as sp
    import types

    import orchestrator.execution.engine_child.supervisor as L

    tr = {"enter": t_enter, "imported": t_imported, "job": t_job, "events": [], "arrow_s": 0.0}

    class Popen(sp.Popen):
        def __init__(self, *a, **k):
            tr.setdefault("popen", time.time())
            super().__init__(*a, **k)

        def poll(self):
            rc = super().poll()
            if rc is not None:
                tr.setdefault("exit_seen", time.time())
            return rc

    L.subprocess = types.SimpleNamespace(**(vars(sp) | {"Popen": Popen}))   # PIPE, TimeoutExpired ... as they are

    def timed(name, fn):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                tr[name] += time.perf_counter() - t
        return wrapper

    read = L._read_events

    def read_events(path, offset):
        events, offset = read(path, offset)
        now = time.time()
        tr["events"] += [(e.event, e.t, now, getattr(e, "load_s", None)) for e in events]
        return events, offset

    L._read_events = read_events
    # the supervisor's own references to the rows' builders (the cell's row; its logprob, task and sample rows),
    # those this checkout has (a checkout of before 7d18aa2 calls cell_row `measured`)
    for name in ("measured", "cell_row", "read_logprob_rows", "read_task_rows", "read_sample_rows"):
        if hasattr(L, name):
            setattr(L, name, timed("arrow_s", getattr(L, name)))
    rows = orchestrator.execution.scheduling.scheduler._run_on_node(job)   # run_group, and the rows as the task hands them back
    tr["returned"] = time.time()
    return rows, tr


def measure_group(engine: str, work: Path, cache: Path) -> dict:
    import ray
    import yaml

    from orchestrator.execution.runner import framework_python
    from orchestrator.execution.scheduling.scheduler import alive_nodes, job_need
    from orchestrator.execution.engine_child.spec import GroupJob
    from orchestrator.matrix.cells import expand, group
    from orchestrator.matrix.validate import load_matrix
    from orchestrator.store.run_store import RunStore

    path = work / f"{engine}.yaml"
    path.write_text(yaml.safe_dump(_matrix(engine)))
    m, _ = load_matrix(path)
    store = RunStore(work / f"run-{engine}-{time.monotonic_ns()}")
    (g,) = group(expand(m))
    job = GroupJob(run_id=store.run_id, group=g, matrix=m, device="cpu", python=framework_python(m, engine),
                   cache_dir=str(cache), tries=1)
    import orchestrator.execution.scheduling.scheduler as sched

    need = job_need(job, list(alive_nodes().values()))
    # the scheduler's own task options: max_calls=1 (a fresh Ray worker per group) where that checkout's
    # task for this group has it
    real = getattr(sched, "_gpu_group_task", sched._group_task) if need.gpus else sched._group_task
    task = ray.remote(**real._default_options)(traced_group_task).options(**need.ray_options())
    blob = pickle.dumps(job)
    t_submit = time.time()
    rows, tr = ray.get(task.remote(blob))
    rows = [r.unpacked() if hasattr(r, "unpacked") else r for r in rows]   # (a checkout of before the IPC hand-back)
    t_got = time.time()
    with store.writing():
        for row, lp, tasks, samples in rows:
            store.write_cell(row | {"started_at": "x"}, lp, tasks, samples)
    t_written = time.time()
    bad = [r.row for r in rows if r.row["status"] != "ok"]
    if bad:
        raise RuntimeError(f"{engine}: {bad[0]['status']}: {bad[0]['reason']}")

    ev = tr["events"]
    first = lambda name: next(e for e in ev if e[0] == name)
    starts = [e for e in ev if e[0] == "cell_start"]
    dones = [e for e in ev if e[0] == "cell_done"]
    # a cell starts twice where the group's drift check times it early (adapters/worker/group.py): every span
    # from a cell_start to the next start or done is the cells' work, every span from a done to the next start
    # is between cells
    marks = sorted((e[1], e[0]) for e in starts + dones)
    spans = list(zip(marks, marks[1:]))
    t_start, t_loaded, t_end = first("start")[1], first("loaded")[1], first("end")[1]
    # one after the other, they add up to the total (submit -> Parquet written)
    out = {
        "Ray task start": tr["enter"] - t_submit,
        "worker imports": tr["imported"] - tr["enter"],
        "job unpickling": tr["job"] - tr["imported"],
        "spec (prompts)": tr["popen"] - tr["job"],
        "child start": t_start - tr["popen"],
        "engine import + load": t_loaded - t_start,
        "loaded -> first cell": starts[0][1] - t_loaded,
        "cells": sum(b[0] - a[0] for a, b in spans if a[1] == "cell_start"),
        "between cells": sum(b[0] - a[0] for a, b in spans if a[1] == "cell_done"),
        "child close": t_end - dones[-1][1],
        "child exit": tr["exit_seen"] - t_end,
        "launcher finish": tr["returned"] - tr["exit_seen"],
        "hand-back via Ray": t_got - tr["returned"],
        "Parquet write": t_written - t_got,
    }
    out["total"] = t_written - t_submit
    out["group overhead"] = out["total"] - out["engine import + load"] - out["cells"]
    # not on the path above: the launcher does these while the child runs the next cell
    out["(outputs -> Arrow)"] = tr["arrow_s"]
    out["(event polling lag)"] = sum(d[2] - d[1] for d in dones) / len(dones)
    out["(engine's load_s)"] = first("loaded")[3]
    out["(logprob rows)"] = float(sum(r.logprobs.num_rows for r in rows if r.logprobs is not None))
    return out


def bench_end_to_end(engine: str, work: Path, env: dict) -> tuple[float, float]:
    """`bench run` of the same matrix: wall time, and wall time minus load_s and the cells' duration_s."""
    from orchestrator.store.run_store import RunStore

    run_dir = work / f"e2e-{engine}-{time.monotonic_ns()}"
    t = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", str(work / f"{engine}.yaml"),
                           "--run-dir", str(run_dir)], cwd=env["PYTHONPATH"].split(os.pathsep)[0], env=env,
                          capture_output=True, text=True, check=False)
    wall = time.monotonic() - t
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    cells = RunStore(run_dir).read_cells()
    return wall, wall - float(cells["load_s"].iloc[0]) - float(cells["duration_s"].sum())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", default="hf,llamacpp,vllm")
    p.add_argument("--repeats", type=int, default=3, help="groups per engine; the table shows medians")
    p.add_argument("--no-e2e", action="store_true", help="skip the `bench run` end-to-end line")
    p.add_argument("--root", type=Path, default=ROOT, help="the checkout to measure (default: this one; e.g. a "
                   "copy without a fix, for before/after)")
    p.add_argument("--quick", action="store_true", help="the smallest run of the same code path, for CI: llamacpp "
                   "alone, one group, the `bench run` line included (about a minute)")
    args = p.parse_args(argv)
    if args.quick:
        args.engines, args.repeats = "llamacpp", 1
    sys.path.insert(0, str(args.root))
    engines = args.engines.split(",")
    cache = Path(os.environ.get("LOSSLESS_BENCH_CACHE", Path.home() / ".cache" / "lossless-bench"))
    os.environ["LOSSLESS_BENCH_CACHE"] = str(cache)
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(args.root), os.environ.get("PYTHONPATH")]))}
    os.environ["PYTHONPATH"] = env["PYTHONPATH"]   # the Ray workers import this checkout
    work = Path(tempfile.mkdtemp(prefix="bench-fixed-"))
    load_before = os.getloadavg()

    from orchestrator.execution.scheduling.scheduler import init_ray

    t = time.time()
    init_ray(None)
    ray_init = time.time() - t
    results = {e: [measure_group(e, work, cache) for _ in range(args.repeats)] for e in engines}
    print(f"measured {args.root}: {', '.join(sys.modules[m].__file__ for m in ('orchestrator.execution.engine_child.supervisor', 'adapters'))}",
          file=sys.stderr)
    import ray

    ray.shutdown()
    e2e = {} if args.no_e2e else {e: bench_end_to_end(e, work, env) for e in engines}
    load_after = os.getloadavg()

    names = list(results[engines[0]][0])
    print(f"fixed cost per engine group (builtin:tiny, 2 cells, default measure), median of {args.repeats}, "
          f"seconds; load avg {load_before[0]:.2f} -> {load_after[0]:.2f}\n")
    first = results[engines[0]][0]   # the run's first group: a fresh Ray worker, nothing imported yet
    print(f"{'piece':24}" + "".join(f"{e:>10}" for e in engines) + f"{'1st group':>12}")
    print("-" * (36 + 10 * len(engines)))
    for name in names:
        vals = [statistics.median(r[name] for r in results[e]) for e in engines] + [first[name]]
        fmt = (lambda v: f"{v:>10.0f}") if name == "(logprob rows)" else (lambda v: f"{v:>10.3f}")
        print(f"{name:24}" + "".join(fmt(v) for v in vals[:-1]) + "  " + fmt(vals[-1]))
    goal = ["met" if statistics.median(r["group overhead"] for r in results[e]) < 2.0 else "MISSED" for e in engines]
    print(f"{'goal < 2 s':24}" + "".join(f"{v:>10}" for v in goal) + f"{'met' if first['group overhead'] < 2 else 'MISSED':>12}")
    print(f"\n(1st group: the first {engines[0]} group of the run, in the median too)")
    print(f"per run: ray.init {ray_init:.3f} s")
    for e, (wall, beyond) in e2e.items():
        print(f"bench run, {e}: {wall:.2f} s wall, {beyond:.2f} s beyond load_s + the cells' duration_s "
              f"(CLI start, ray.init, the group's overhead, compaction, ray shutdown)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
