"""A `bench run`'s fixed cost per run, piece by piece, for one or more checkouts, alternated.

Each round runs `bench run` of one hf cell (builtin:tiny, 16 in / 8 out, batch 1) once per checkout,
in turn (A B, B A, ...: drift hits both). The run is the real CLI, `python -m orchestrator.cli run`,
in a fresh interpreter, started through a tracer (this file, `--trace`) that wraps the runner's pieces
with timers from outside (module attributes patched in that process; nothing changed in the code) and
appends a timestamp per piece to a file at once, so a process that ends with os._exit loses none.

Pieces (seconds, wall clock; one after the other, they add up to the total):
  interpreter start       Popen -> the tracer's first line
  import orchestrator.cli
  import ray              `import orchestrator.execution.scheduling.scheduler` (Ray, the launcher): the run does it before ray.init
  matrix                  load_matrix (+ expand): every matrix check
  manifest.write          both writes (start and end of the run)
  ray.init                scheduler.init_ray (the watchdog's start included): not in the goal
  group                   scheduler.schedule: the one group, of which the engine's own load_s and the
                          cell's duration_s (from the stored row) are not in the goal
  compaction              compaction.compact
  rest of run_matrix      run_matrix's other work (resume scan, the run dir lock, cell writes ...)
  (tracer's imports)      runner, compaction, manifest, which the CLI imports later anyway
  summary                 the `run` command's body after run_matrix: store.read_cells and what it prints
  exit                    the summary printed -> the process gone (atexit, Ray shutdown, teardown)
  beyond ray.init + engine  total minus ray.init, load_s and duration_s: the goal, under 3 s

    .venv/bin/python benchmarks/run_cost.py --rounds 3 --root /tmp/before --root .   # before/after
    .venv/bin/python benchmarks/run_cost.py --quick     # one round, this checkout (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MATRIX = {"name": "runcost", "models": {"tiny": "builtin:tiny"},
          "axes": {"framework": ["hf"], "model": ["tiny"], "quantization": ["fp32"], "batch_size": [1],
                   "input_len": [16], "output_len": [8]},
          "run": {"cell_timeout_s": 900}}
PIECES = ["interpreter start", "import orchestrator.cli", "import ray", "matrix", "manifest.write", "ray.init", "group",
          "  engine load_s", "  cell duration_s", "  group overhead", "compaction", "rest of run_matrix", "(tracer's imports)",
          "summary", "exit", "total", "beyond ray.init + engine"]


def trace(stamps: str, argv: list[str]) -> None:
    """In the traced `bench run` process: time the pieces, then run the CLI as `python -m` would."""
    fd = os.open(stamps, os.O_WRONLY | os.O_APPEND | os.O_CREAT)

    def stamp(name: str, t: float | None = None) -> None:
        os.write(fd, f"{name} {time.time() if t is None else t}\n".encode())

    stamp("started")
    import orchestrator.cli as cli
    stamp("imported")
    import orchestrator.execution.runner as runner
    import orchestrator.store.compaction as compaction
    import orchestrator.store.manifest as manifest
    t = time.time()
    import orchestrator.execution.scheduling.scheduler as scheduler  # the run imports it (and Ray) once it has work: timed here
    stamp("import ray+", time.time() - t)

    def timed(mod, attr: str, name: str) -> None:
        fn = getattr(mod, attr)

        def wrapper(*a, **k):
            t = time.time()
            try:
                return fn(*a, **k)
            finally:
                stamp(f"{name}+", time.time() - t)
        setattr(mod, attr, wrapper)

    timed(runner, "load_matrix", "matrix")
    timed(runner, "expand", "matrix")
    timed(manifest, "write", "manifest.write")
    timed(scheduler, "init_ray", "ray.init")
    timed(scheduler, "schedule", "group")
    timed(compaction, "compact", "compaction")
    timed(runner, "run_matrix", "run_matrix")
    fn = runner.run_matrix

    def run_matrix(*a, **k):
        stamp("run_matrix_start")
        try:
            return fn(*a, **k)
        finally:
            stamp("run_matrix_done")
    runner.run_matrix = run_matrix
    # the command's body returned (its summary printed): what follows is the exit. Wrapped where typer registered
    # it, whichever module of the CLI defines it and whatever it prints
    import functools

    (command,) = [c for c in cli.app.registered_commands if (c.name or c.callback.__name__) == "run"]
    body = command.callback

    @functools.wraps(body)
    def run_command(*a, **k):
        try:
            return body(*a, **k)
        finally:
            sys.stdout.flush()
            stamp("printed")
    command.callback = run_command
    sys.argv = ["bench", *argv]
    cli.app()   # the entry point `python -m orchestrator.cli` and the `bench` script call


def one_run(root: Path, matrix: Path, work: Path) -> dict:
    from orchestrator.execution.reaper import cluster_processes
    from orchestrator.store.run_store import RunStore

    stamps = work / f"stamps-{time.monotonic_ns()}"
    run_dir = work / f"run-{time.monotonic_ns()}"
    env = os.environ | {"PYTHONPATH": str(root)}
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--trace", str(stamps), "run", str(matrix),
                             "--run-dir", str(run_dir)], cwd=root, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    _, stderr = proc.communicate()
    t_end = time.time()
    if proc.returncode:
        raise RuntimeError(f"{root}: exit {proc.returncode}\n{stderr[-3000:]}")
    # the run's cluster: its session dir ends in the driver's pid (orchestrator/execution/reaper.py)
    left = len(cluster_processes(re.compile(rf"/session_[^/]*_{proc.pid}/")))
    sums: dict[str, float] = {}
    at: dict[str, float] = {}
    for line in stamps.read_text().splitlines():
        name, value = line.rsplit(" ", 1)
        if name.endswith("+"):
            sums[name[:-1]] = sums.get(name[:-1], 0.0) + float(value)
        else:
            at[name] = float(value)
    cells = RunStore(run_dir).read_cells()
    load_s, duration_s = float(cells["load_s"].iloc[0]), float(cells["duration_s"].sum())
    out = {"interpreter start": at["started"] - t0, "import orchestrator.cli": at["imported"] - at["started"],
           "import ray": sums["import ray"], "matrix": sums["matrix"], "manifest.write": sums["manifest.write"], "ray.init": sums["ray.init"],
           "group": sums["group"], "  engine load_s": load_s, "  cell duration_s": duration_s,
           "  group overhead": sums["group"] - load_s - duration_s, "compaction": sums["compaction"],
           "summary": at["printed"] - at["run_matrix_done"], "exit": t_end - at["printed"], "total": t_end - t0}
    inside = sum(sums[k] for k in ("matrix", "manifest.write", "ray.init", "group", "compaction"))
    out["rest of run_matrix"] = sums["run_matrix"] - inside
    # imported -> run_matrix called: the tracer's imports (Ray's timed above) and typer's dispatch
    out["(tracer's imports)"] = at["run_matrix_start"] - at["imported"] - sums["import ray"]
    out["beyond ray.init + engine"] = out["total"] - out["ray.init"] - load_s - duration_s
    out["(processes left)"] = float(left)   # of the run's cluster, as the process ended
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--trace"]:
        trace(argv[1], argv[2:])
        return 0
    sys.path.insert(0, str(ROOT))   # not in the traced process: it imports the checkout it measures
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, action="append", help="a checkout to measure (repeatable; default: this one)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", type=Path, help="write every run's pieces here")
    p.add_argument("--quick", action="store_true", help="one round, for CI")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds = 1
    roots = [r.resolve() for r in (args.root or [ROOT])]
    os.environ.setdefault("LOSSLESS_BENCH_CACHE", str(Path.home() / ".cache" / "lossless-bench"))
    work = Path(tempfile.mkdtemp(prefix="bench-runcost-"))
    matrix = work / "matrix.yaml"
    matrix.write_text(json.dumps(MATRIX))   # JSON is YAML
    load_before = os.getloadavg()
    runs: dict[Path, list[dict]] = {r: [] for r in roots}
    for i in range(args.rounds):
        order = roots if i % 2 == 0 else roots[::-1]
        for root in order:
            runs[root].append(one_run(root, matrix, work))
            print(f"round {i + 1} {root}: total {runs[root][-1]['total']:.2f} s, beyond "
                  f"{runs[root][-1]['beyond ray.init + engine']:.2f} s", file=sys.stderr)
    load_after = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps({str(r): v for r, v in runs.items()}, indent=1))
    print(f"a `bench run`'s pieces (one hf cell), median of {args.rounds} runs per checkout, seconds; "
          f"load avg {load_before[0]:.2f} -> {load_after[0]:.2f}\n")
    names = [str(r) if len(str(r)) <= 24 else "..." + str(r)[-21:] for r in roots]
    print(f"{'piece':26}" + "".join(f"{n:>26}" for n in names))
    print("-" * (26 + 26 * len(roots)))
    for piece in [*PIECES, "(processes left)"]:
        cols = []
        for r in roots:
            vals = [run[piece] for run in runs[r]]
            cols.append(f"{statistics.median(vals):8.3f} [{min(vals):6.3f}-{max(vals):6.3f}]")
        print(f"{piece:26}" + "".join(f"{c:>26}" for c in cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
