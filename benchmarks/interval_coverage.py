"""How often does a "95%" speed-up interval hold the true speed-up, at the repeat counts runs use?

Simulated per-repeat throughputs: log-normal, baseline median 100 tok/s, the cell exactly `--ratio`
times faster (so the true ratio of both means and of geometric means is `--ratio`), the same log
sigma on both sides, `--trials` independent (cell, baseline) pairs per setting, seeded. Each pair
gets both intervals:

  bootstrap   the analysis's former interval: 2.5/97.5 percentiles of mean(num*)/mean(den*) over
              2,000 resamples of each side's repeats (drawn afresh for every pair)
  welch-log   adapters/contract/intervals.py log_ratio_interval: Welch's t interval on the difference of
              the mean logs, Welch-Satterthwaite df, exponentiated

Coverage is the share of pairs whose interval holds the true ratio; width is (hi - lo) / the
point estimate, median over pairs. Output is a Markdown table.

    python benchmarks/interval_coverage.py                   # 10,000 pairs per setting, ~30 s
    python benchmarks/interval_coverage.py --trials 20000 --seed 1
    python benchmarks/interval_coverage.py --quick           # 200 pairs per setting (CI)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from adapters.contract.intervals import log_ratio_intervals  # noqa: E402

RESAMPLES = 2000


def bootstrap(num: np.ndarray, den: np.ndarray, rng: np.random.Generator, chunk: int = 200):
    """Percentile bootstrap of mean(num)/mean(den) per row, as orchestrator/judge/analysis.py had it."""
    lo, hi = np.empty(len(num)), np.empty(len(num))
    for s in range(0, len(num), chunk):   # (chunk, resamples, n) index arrays: bounded memory
        n, d = num[s:s + chunk], den[s:s + chunk]
        pn = rng.integers(0, n.shape[1], (len(n), RESAMPLES, n.shape[1]))
        pd_ = rng.integers(0, d.shape[1], (len(d), RESAMPLES, d.shape[1]))
        mn = np.take_along_axis(n[:, None, :], pn, axis=2).mean(axis=2)
        md = np.take_along_axis(d[:, None, :], pd_, axis=2).mean(axis=2)
        lo[s:s + chunk], hi[s:s + chunk] = np.percentile(mn / md, [2.5, 97.5], axis=1)
    return lo, hi


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=10_000, help="(cell, baseline) pairs per setting")
    ap.add_argument("--ratio", type=float, default=1.2, help="the true speed-up")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="200 pairs per setting, for CI (seconds)")
    args = ap.parse_args()
    if args.quick:
        args.trials = 200

    print(f"true ratio {args.ratio}, {args.trials:,} simulated pairs per row, nominal level 95%, seed {args.seed}\n")
    print("| repeats per side | log sigma | bootstrap coverage | welch-log coverage "
          "| bootstrap median width | welch-log median width |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in (3, 5, 10):
        for k, sigma in enumerate((0.02, 0.1, 0.3)):
            rng = np.random.default_rng([args.seed, n, k])   # each row its own stream
            den = 100.0 * np.exp(sigma * rng.standard_normal((args.trials, n)))
            num = args.ratio * 100.0 * np.exp(sigma * rng.standard_normal((args.trials, n)))
            point = num.mean(axis=1) / den.mean(axis=1)
            rows = []
            for lo, hi in (bootstrap(num, den, rng), log_ratio_intervals(num, den)[1:]):
                cover = np.mean((lo <= args.ratio) & (args.ratio <= hi))
                rows.append((cover, np.median((hi - lo) / point)))
            (bc, bw), (wc, ww) = rows
            if not (0 < bc <= 1 and 0 < wc <= 1 and bw > 0 and ww > 0):
                sys.exit(f"coverage or width out of range: {rows}")
            print(f"| {n} | {sigma} | {bc:.1%} | {wc:.1%} | {bw:.3f} | {ww:.3f} |", flush=True)


if __name__ == "__main__":
    main()
