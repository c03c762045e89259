"""Does the sampling layer's distribution test catch a changed sampler, and does it cry wolf?

    python benchmarks/sampling_power.py [--engine hf|llamacpp] [--seeds 16] [--prompts 8] [--tokens 16]

On the built-in tiny model, with the engine's own seeded sampler (the adapter's `sample`, in this
process), at the matrix defaults of `measure.sampling` used by matrices/smoke.yaml:
  power         a deliberately different sampler, top-p 0.95 vs 0.8 and temperature 0.8 vs 1.0 (top-p
                0.95), each side its own seeds: the test's p-value (orchestrator/sampling_stats.py)
  false alarms  the same settings on both sides, 20 comparisons with disjoint seed sets: how many
                reach p < alpha (0.01); the test's level promises about alpha x 20 = 0.2 of them
Each comparison is `prompts x seeds` samples a side, as a cell of the smoke run stores them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from adapters import ADAPTERS  # noqa: E402
from adapters.contract import LoadSpec, ModelSpec, SamplerSettings  # noqa: E402
from orchestrator.matrix import Measure  # noqa: E402
from orchestrator.sampling_stats import permutation_test  # noqa: E402
from orchestrator.tiny_model import default_cache_root, resolve_builtin  # noqa: E402
from orchestrator.workload import Tokenizer, scoring_prompts  # noqa: E402

ALPHA = 0.01


def draw(adapter, prompts, settings: SamplerSettings, seeds: range, tokens: int, batch: int = 8):
    pairs = [(i, s) for i in range(len(prompts)) for s in seeds]
    stats, strata = [], []
    for k in range(0, len(pairs), batch):
        chunk = pairs[k:k + batch]
        for (i, _), out in zip(chunk, adapter.sample([prompts[i] for i, _ in chunk], [s for _, s in chunk], settings, tokens)):
            stats.append(float(np.mean(out.logprobs)))
            strata.append(i)
    return np.array(stats), np.array(strata)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default="hf", choices=["hf", "llamacpp"])
    ap.add_argument("--seeds", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=20, help="same-settings comparisons for the false-alarm rate")
    args = ap.parse_args()

    source = resolve_builtin("tiny", default_cache_root())
    measure = Measure(scoring_prompts=args.prompts, scoring_len=64)
    prompts = scoring_prompts(measure, Tokenizer(str(source)))
    adapter = ADAPTERS[args.engine]()
    adapter.load(LoadSpec(framework=args.engine, model=ModelSpec(name="tiny", source=str(source)), quantization="fp32",
                          context_len=64 + args.tokens, cache_dir=str(default_cache_root() / "engines")))
    base = SamplerSettings(temperature=0.8, top_p=0.95)
    n = args.seeds
    t0 = time.perf_counter()
    print(f"engine {args.engine}; {args.prompts} prompts x {n} seeds x {args.tokens} tokens a side; alpha {ALPHA}")
    print(f"{'comparison':44} {'shift nats/tok':>14} {'p':>9}  verdict")
    ref = draw(adapter, prompts, base, range(0, n), args.tokens)
    for name, other in (("top_p 0.95 vs 0.8 (temperature 0.8)", SamplerSettings(temperature=0.8, top_p=0.8)),
                        ("temperature 0.8 vs 1.0 (top_p 0.95)", SamplerSettings(temperature=1.0, top_p=0.95))):
        got = draw(adapter, prompts, other, range(10_000, 10_000 + n), args.tokens)
        t = permutation_test(ref[0], ref[1], got[0], got[1])
        print(f"{name:44} {t.shift:>+14.4f} {t.p_value:>9.2g}  {'different' if t.p_value < ALPHA else 'same distribution'}")
    alarms, ps = 0, []
    for r in range(args.repeats):
        a = draw(adapter, prompts, base, range(20_000 + 2 * r * n, 20_000 + (2 * r + 1) * n), args.tokens)
        b = draw(adapter, prompts, base, range(20_000 + (2 * r + 1) * n, 20_000 + (2 * r + 2) * n), args.tokens)
        p = permutation_test(a[0], a[1], b[0], b[1]).p_value
        ps.append(p)
        alarms += p < ALPHA
    print(f"{'same settings, ' + str(args.repeats) + ' comparisons':44} {'':>14} {'':>9}  {alarms} false alarm(s) "
          f"at p < {ALPHA} (expected {ALPHA * args.repeats:.1f}); p-values min {min(ps):.3f}, median {np.median(ps):.3f}")
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
