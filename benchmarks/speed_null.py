"""Do identical configurations get speed calls in one run on a host whose load moves, and are real
differences still called?

A null matrix: the built-in tiny model, fp32, batch 1 and 4, in two engines, each under three flag sets that
change nothing: hf `default`, `same` = {attn_implementation: sdpa} (transformers' default for Llama) and
`same_again` = {attn_implementation: sdpa, static_cache: false}; llama.cpp `default`, `same` = {flash_attn:
auto} (its default) and `same_again` = {flash_attn: auto, n_threads: this host's CPU count} (its default).
The baseline is {flags: default}: every `same*` cell is judged against its own engine's default cell at its
batch size, so each run holds 2 engines x 2 flag sets x 2 batch sizes = 8 null comparisons; any `faster` /
`slower` among them is a false call. With measure.paired_timing (off by default, on here unless --paired-timing
off: as before) each `same*` group has its engine's `default` loaded beside it as a timing twin, and its null
comparisons are paired t. Real differences, the judge's own rows of a second `bench run` in the same condition
(hf and llama.cpp `default`, batch 1 and 4, baseline hf batch 1): llama.cpp over hf at batch 1 (with paired
timing the llama.cpp cell's repeats take turns with hf's twin) and hf batch 4 over batch 1 (one engine load: its
repeats take turns with batch 1's inside it, adapters/worker/timing_partner.py, unless --paired-timing off). The
same batch comparison timed apart (Welch on the null run's cells, widened by run_drift, as before in-group turns)
is printed beside it, not counted.

Each run is one `bench run`, under one condition: `quiet`, or `busy` (--busy-procs background loops, each
busy and idle in turns of --busy-period seconds, 5-30 s by default). Per condition: false calls of the null
comparisons, `cannot judge` (host busy), the real differences called in the expected direction, and the
median relative width ((hi - lo) / ratio) of the null intervals before (repeats alone, Welch) and after (the
judge's interval, widened by the drift between the group's drift-check measurements).

    python benchmarks/speed_null.py --runs 3            # quiet x1 + busy x3, 6 repeats: ~15-25 min on 2 cores
    python benchmarks/speed_null.py --runs 3 --paired-timing off   # the same without paired timing (before)
    python benchmarks/speed_null.py --quick             # one quiet hf-only run, flags default/same, 2 repeats (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from orchestrator.judge.analysis import analyse
from orchestrator.judge.speed import run_drift, speed_call, speed_intervals
from orchestrator.store.run_store import RunStore

BUSY = """
import random, sys, time
rng, lo, hi = random.Random(int(sys.argv[3])), float(sys.argv[1]), float(sys.argv[2])
while True:
    end = time.monotonic() + rng.uniform(lo, hi)
    while time.monotonic() < end:
        sum(i * i for i in range(2000))
    time.sleep(rng.uniform(lo, hi))
"""

CALLS = ("faster", "slower")


def matrix(frameworks: list[str], batches: list[int], repeats: int, flags: list[str], paired: bool,
           baseline: dict | None = None, output_len: int = 16) -> dict:
    cores = len(os.sched_getaffinity(0))
    return {"name": "speed-null", "models": {"tiny": "builtin:tiny"},
            "axes": {"framework": frameworks, "model": ["tiny"], "quantization": ["fp32"], "batch_size": batches,
                     "flags": flags, "input_len": [32], "output_len": [output_len]},
            "flags": {"hf": {"same": {"attn_implementation": "sdpa"},
                             "same_again": {"attn_implementation": "sdpa", "static_cache": False}},
                      "llamacpp": {"same": {"flash_attn": "auto"},
                                   "same_again": {"flash_attn": "auto", "n_threads": cores}}},
            "measure": {"warmup": 1, "repeats": repeats, "scoring_prompts": 1, "scoring_len": 16,
                        "greedy_tokens": 2, "score_repeats": 1, "top_k": 2, "paired_timing": paired},
            "baseline": baseline or {"quantization": "fp32", "flags": "default"},
            "run": {"cell_timeout_s": 300, "load_timeout_s": 300}}


def bench_run(work: Path, name: str, m: dict) -> Path:
    (work / f"{name}.yaml").write_text(yaml.safe_dump(m))
    run_dir = work / name
    subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", str(work / f"{name}.yaml"), "--run-dir",
                    str(run_dir), "--quiet"], cwd=ROOT, check=True, capture_output=True,
                   env=os.environ | {"PYTHONPATH": str(ROOT)})
    return run_dir


def _rel_width(lo: float, hi: float, c: float) -> float:
    return (hi - lo) / c if np.isfinite([lo, hi, c]).all() and c else float("nan")


def judge_run(run_dir: Path, real_dir: Path | None) -> dict:
    """The run's null comparisons (the judge's rows) and its real differences (llama.cpp / hf: the judge's row of
    `real_dir`; batch 4 / batch 1: the judge's functions on the null run)."""
    df = analyse(run_dir)
    null = df[(df.cell_id != df.baseline_cell_id) & (df.flags != "default") & (df.status == "ok")]
    cells = RunStore(run_dir).read_cells()
    cells = cells[cells.status == "ok"].set_index(["framework", "flags", "batch_size"])
    runs = {k: np.asarray(v, float) for k, v in cells.output_tok_s_runs.items()}
    before = speed_intervals([runs[(r.framework, r.flags, r.batch_size)] for r in null.itertuples()],
                             [runs[(r.framework, "default", r.batch_size)] for r in null.itertuples()])
    var, dof, source = run_drift(cells.reset_index())
    real, apart = {}, None
    num, den = ("hf", "default", 4), ("hf", "default", 1)
    if num in runs and den in runs:   # the batch comparison timed apart (two cells of the null run): not counted
        c, lo, hi, *_ = speed_intervals([runs[num]], [runs[den]], var, dof)
        apart = {"ratio": float(c[0]), "lo": float(lo[0]), "hi": float(hi[0]), "call": speed_call(lo, hi, 0.05)[0],
                 "test": "Welch t"}
    if real_dir is not None:
        rdf = analyse(real_dir)
        for name, fw, batch, want in (("llamacpp / hf, batch 1", "llamacpp", 1, None),
                                      ("hf batch 4 / batch 1", "hf", 4, "faster")):
            for r in rdf[(rdf.framework == fw) & (rdf.batch_size == batch) & (rdf.status == "ok")].itertuples():
                real[name] = {"ratio": float(r.speedup), "lo": float(r.speedup_lo), "hi": float(r.speedup_hi),
                              "call": r.speed_call, "want": want, "test": r.speed_test,
                              "reason": r.speed_reason if isinstance(r.speed_reason, str) else None}
    return {"null": [{"cell": f"{r.framework}/{r.flags} batch {r.batch_size}", "call": r.speed_call,
                      "reason": r.speed_reason if isinstance(r.speed_reason, str) else None,
                      "ratio": float(r.speedup), "lo": float(r.speedup_lo), "hi": float(r.speedup_hi),
                      "before": [float(before[1][i]), float(before[2][i])], "test": r.speed_test}
                     for i, r in enumerate(null.itertuples())],
            "real": real, "batch_apart": apart, "drift_sd": float(np.sqrt(var)) if source else None, "drift": source}


def summarise(cond: str, runs: list[dict]) -> str:
    nulls = [n for r in runs for n in r["null"]]
    false = sum(n["call"] in CALLS for n in nulls)
    withheld = sum(n["call"] == "cannot judge" for n in nulls)
    before = float(np.nanmedian([_rel_width(*n["before"], n["ratio"]) for n in nulls])) if nulls else float("nan")
    after = float(np.nanmedian([_rel_width(n["lo"], n["hi"], n["ratio"]) for n in nulls])) if nulls else float("nan")
    # llama.cpp vs hf: a real difference either way (which engine is faster depends on the host); batch: faster
    def called(values) -> str:
        values = [v for v in values if v]
        return f"{sum(v['call'] in CALLS and v.get('want') in (None, v['call']) for v in values)}/{len(values)}"

    engines = called(r["real"].get("llamacpp / hf, batch 1") for r in runs)
    batch = called(r["real"].get("hf batch 4 / batch 1") for r in runs)
    apart = called({**r["batch_apart"], "want": "faster"} if r.get("batch_apart") else None for r in runs)
    false_before = sum(lo > 1 or hi < 1 for n in nulls for lo, hi in [n["before"]] if np.isfinite([lo, hi]).all())
    paired = sum(n["test"] == "paired t" for n in nulls)
    return (f"| {cond} | {len(runs)} | {false}/{len(nulls)} | {false_before}/{len(nulls)} | {withheld} | "
            f"{engines} | {batch} | {apart} | {before:.3f} | {after:.3f} | {paired}/{len(nulls)} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="busy runs (one quiet run besides)")
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--conditions", nargs="+", default=["quiet", "busy"], choices=["quiet", "busy"])
    ap.add_argument("--frameworks", nargs="+", default=["hf", "llamacpp"])
    ap.add_argument("--flags", nargs="+", default=["default", "same", "same_again"])
    ap.add_argument("--busy-procs", type=int, default=2)
    ap.add_argument("--busy-period", nargs=2, type=float, default=[5.0, 30.0], metavar=("LO", "HI"),
                    help="busy host: each background process is busy, then idle, for LO-HI s each (uniform)")
    ap.add_argument("--output-len", type=int, default=16, help="tokens generated per request (longer: longer repeats)")
    ap.add_argument("--paired-timing", choices=["on", "off"], default="on",
                    help="measure.paired_timing of both matrices (off: each cell against its baseline's own row)")
    ap.add_argument("--json", type=Path, help="Write every run's comparisons here")
    ap.add_argument("--quick", action="store_true", help="one quiet hf-only run, flags default and same, batch 1 and 4, 2 repeats (CI)")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.repeats, args.conditions, args.frameworks, args.flags = 1, 2, ["quiet"], ["hf"], ["default", "same"]
    paired = args.paired_timing == "on"
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="speed-null-") as tmp:
        work = Path(tmp)
        for cond in args.conditions:
            busy = [subprocess.Popen([sys.executable, "-c", BUSY, *map(str, args.busy_period), str(i)],
                                     start_new_session=True) for i in range(args.busy_procs)] if cond == "busy" else []
            try:
                results[cond] = []
                for i in range(1 if cond == "quiet" else args.runs):
                    t0 = time.time()
                    run = bench_run(work, f"{cond}-{i}", matrix(args.frameworks, [1, 4], args.repeats, args.flags,
                                                                 paired, output_len=args.output_len))
                    real = None
                    if {"hf", "llamacpp"} <= set(args.frameworks):
                        real = bench_run(work, f"{cond}-{i}-real", matrix(
                            ["hf", "llamacpp"], [1, 4], args.repeats, ["default"], paired,
                            {"framework": "hf", "quantization": "fp32", "flags": "default", "batch_size": 1},
                            args.output_len))
                    results[cond].append(judge_run(run, real))
                    calls = [(n["cell"], n["call"]) for n in results[cond][-1]["null"]]
                    reals = [(k, v["call"], v.get("test")) for k, v in results[cond][-1]["real"].items()]
                    apart = (results[cond][-1]["batch_apart"] or {}).get("call")
                    print(f"{cond} run {i}: {calls} real: {reals}; batch 4 / 1 timed apart: {apart} "
                          f"({time.time() - t0:.0f} s)", file=sys.stderr)
            finally:
                for p in busy:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
    print(f"null matrix: {'+'.join(args.frameworks)}, tiny fp32, flags {'/'.join(args.flags)}, batch 1 and 4, "
          f"{args.output_len} tokens out, "
          f"{args.repeats} timed repeats; busy: {args.busy_procs} loops switching every "
          f"{args.busy_period[0]:g}-{args.busy_period[1]:g} s; paired timing {args.paired_timing}\n")
    print("| host | runs | false calls (judge) | false calls (repeats alone) | cannot judge | llama.cpp / hf called "
          "| batch 4 / 1 called | batch 4 / 1 timed apart (not counted) | median rel. width before | after "
          "| null tests paired |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for cond, runs in results.items():
        print(summarise(cond, runs))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
