"""How much narrower is an env pair's paired NEW/OLD speed interval than the same two environments compared
across two separate runs?

Two engine environments that differ in one package (`bench env`: this interpreter's packages with tqdm at
another version; the engine, transformers on the built-in tiny model, is the same, so the true ratio is
about 1), measured in rounds, on a quiet host and on a busy one (a background process busy and idle in
turns of --busy-period seconds: 4-15 s by default, a drift on the scale of a run; 0.3 3 flickers faster than
a pair of repeats). Each round, alternating which goes first:

  paired     one `bench run` with `axes.env: [old, new]`: both engines loaded, the timed repeats in turns
             (ABBA); the interval is the paired t interval of the mean log ratio (orchestrator/judge/speed.py)
  separate   two `bench run`s, one env each, one after the other, compared as `bench compare NEW --against
             OLD` does: Welch's t on the log ratio of the two runs' repeats, widened by the run-to-run drift
             (adapters.contract.intervals.run_noise, estimated as --history does from the same
             configuration run again: here each env's runs of the other rounds)
  repeats    the same two runs' interval from their repeats alone (no drift estimate: what the tool refuses
             to call, `cannot judge`), to show what the drift does to it

Per condition and method: the median relative width of the 95% interval ((hi - lo) / ratio), the spread
of the ratio itself over the rounds (sd of log ratio: what the interval should cover), and how many
intervals hold 1. Output: a Markdown table (and --json FILE: every round's numbers).

    python benchmarks/env_pair_noise.py --rounds 4                     # quiet and busy, ~12 min on 2 cores
    python benchmarks/env_pair_noise.py --rounds 4 --conditions busy --busy-period 0.3 3
    python benchmarks/env_pair_noise.py --quick     # one quiet round, 2 repeats: the three `bench run`s (CI)
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
from orchestrator.environments.create import create_env  # noqa: E402
from orchestrator.judge.analysis import analyse  # noqa: E402
from adapters.contract.intervals import run_noise  # noqa: E402
from orchestrator.judge.speed import speed_intervals  # noqa: E402
from orchestrator.store.run_store import RunStore  # noqa: E402

OLD_TQDM = "4.67.1"   # Makefile: ENV_PAIR_TQDM (make env-pair-wheel)


BUSY = """
import random, sys, time
rng, lo, hi = random.Random(1), float(sys.argv[1]), float(sys.argv[2])
while True:
    end = time.monotonic() + rng.uniform(lo, hi)
    while time.monotonic() < end:
        sum(i * i for i in range(2000))
    time.sleep(rng.uniform(lo, hi))
"""


def matrix(envs: dict, axis: list[str], repeats: int) -> dict:
    return {"name": "env-pair-noise", "models": {"tiny": "builtin:tiny"}, "envs": envs,
            "axes": {"framework": ["hf"], "model": ["tiny"], "batch_size": [1], "input_len": [32], "output_len": [32],
                     "env": axis},
            "measure": {"warmup": 2, "repeats": repeats, "scoring_prompts": 1, "scoring_len": 16, "greedy_tokens": 2,
                        "score_repeats": 1, "top_k": 2},
            "baseline": {"framework": "hf", "env": axis[0]},
            "run": {"cell_timeout_s": 300, "load_timeout_s": 300}}


def bench_run(work: Path, name: str, m: dict) -> Path:
    (work / f"{name}.yaml").write_text(yaml.safe_dump(m))
    run_dir = work / name
    subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", str(work / f"{name}.yaml"), "--run-dir", str(run_dir),
                    "--quiet"], cwd=ROOT, check=True, capture_output=True, env=os.environ | {"PYTHONPATH": str(ROOT)})
    return run_dir


def runs_of(run_dir: Path) -> dict[str, np.ndarray]:
    cells = RunStore(run_dir).read_cells()
    assert (cells.status == "ok").all(), cells[["env", "status", "reason"]]
    return {r.env: np.asarray(r.output_tok_s_runs, float) for r in cells.itertuples()}


def one_round(work: Path, envs: dict, repeats: int, i: int, cond: str) -> dict:
    order = ["old", "new"] if i % 2 == 0 else ["new", "old"]
    out = {}
    for method in (["paired", "separate"] if i % 2 == 0 else ["separate", "paired"]):
        if method == "paired":
            run = bench_run(work, f"{cond}-paired-{i}", matrix(envs, ["old", "new"], repeats))
            df = analyse(run).set_index("env")
            assert df.speed_test["new"] == "paired t", df.speed_test
            out["paired"] = (float(df.speedup["new"]), float(df.speedup_lo["new"]), float(df.speedup_hi["new"]))
            out["paired_runs"] = {env: runs.tolist() for env, runs in runs_of(run).items()}
        else:
            got = {}
            for env in order:
                got |= runs_of(bench_run(work, f"{cond}-separate-{i}-{env}", matrix(envs, [env], repeats)))
            c, lo, hi, *_ = speed_intervals([got["new"]], [got["old"]])
            out["repeats"] = (float(c[0]), float(lo[0]), float(hi[0]))
            out["separate_runs"] = {env: runs.tolist() for env, runs in got.items()}
    return out


def with_run_noise(rounds: list[dict]) -> None:
    """Each round's separate runs as `bench compare --against --history` judges them: the drift between runs of
    one configuration (each env's separate runs in the other rounds, pooled) widens the interval."""
    for i, r in enumerate(rounds):
        others = [o["separate_runs"] for j, o in enumerate(rounds) if j != i]
        pairs = [(a[env], b[env]) for a, b in zip(others, others[1:]) for env in ("old", "new")]
        var, df = run_noise([a for a, _ in pairs], [b for _, b in pairs]) if pairs else (0.0, float("inf"))
        runs = r["separate_runs"]
        c, lo, hi, *_ = speed_intervals([np.asarray(runs["new"])], [np.asarray(runs["old"])], var, df)
        r["separate"] = (float(c[0]), float(lo[0]), float(hi[0]))


def summary(rounds: list[dict], method: str) -> tuple[float, float, str]:
    vals = [r[method] for r in rounds]
    width = float(np.median([(hi - lo) / c for c, lo, hi in vals]))
    sd = float(np.std([np.log(c) for c, _, _ in vals], ddof=1)) if len(vals) > 1 else float("nan")
    if not all(np.isfinite([lo, hi]).all() for _, lo, hi in vals):
        return float("nan"), sd, "no interval"
    holds = sum(lo <= 1 <= hi for _, lo, hi in vals)
    return width, sd, f"{holds}/{len(vals)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--conditions", nargs="+", default=["quiet", "busy"], choices=["quiet", "busy"])
    ap.add_argument("--busy-period", nargs=2, type=float, default=[4.0, 15.0], metavar=("LO", "HI"),
                    help="busy host: the background process is busy, then idle, for LO-HI s each (uniform)")
    ap.add_argument("--wheels", default=str(ROOT / ".cache" / "wheels"))
    ap.add_argument("--json", type=Path, help="Write every round's (ratio, lo, hi) here")
    ap.add_argument("--quick", action="store_true", help="one quiet round of 2 repeats, for CI")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.repeats, args.conditions = 1, 2, ["quiet"]
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="env-pair-noise-") as tmp:
        work = Path(tmp)
        old = create_env(work / "venvs" / "old", [f"tqdm=={OLD_TQDM}"], sys.executable, [args.wheels], no_index=True)
        envs = {"old": {"python": str(old)}, "new": {"python": sys.executable}}
        for cond in args.conditions:
            busy = subprocess.Popen([sys.executable, "-c", BUSY, *map(str, args.busy_period)], start_new_session=True) \
                if cond == "busy" else None
            try:
                results[cond] = []
                for i in range(args.rounds):
                    t0 = time.time()
                    results[cond].append(one_round(work, envs, args.repeats, i, cond))
                    got = {k: v for k, v in results[cond][-1].items() if not k.endswith("_runs")}
                    print(f"{cond} round {i}: {got} ({time.time() - t0:.0f} s)", file=sys.stderr)
                with_run_noise(results[cond])
            finally:
                if busy is not None:
                    os.killpg(busy.pid, signal.SIGKILL)
                    busy.wait()
    print(f"{args.rounds} rounds per condition, {args.repeats} timed repeats per cell (hf, tiny model, batch 1, 32 in, "
          f"32 out); true ratio about 1 (the envs differ in tqdm {OLD_TQDM} only)\n")
    print("| host | method | median 95% CI width (rel.) | sd of log ratio over rounds | intervals holding 1 |")
    print("|---|---|---|---|---|")
    for cond, rounds in results.items():
        for method in ("paired", "separate", "repeats"):
            width, sd, holds = summary(rounds, method)
            print(f"| {cond} | {method} | {width:.3f} | {sd:.3f} | {holds} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
