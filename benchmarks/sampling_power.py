"""Do the sampling layer's distribution tests catch a changed sampler, and do they cry wolf?

    python benchmarks/sampling_power.py [--engine hf|llamacpp] [--seeds 16] [--prompts 8] [--tokens 16]
                                        [--seeding per-prompt|shared]
    python benchmarks/sampling_power.py --quick    # 2 prompts x 4 seeds x 4 tokens, 2 repeats (CI, seconds)

On the built-in tiny model, with the engine's own seeded sampler (the adapter's `sample`, in this
process), at the settings of matrices/smoke.yaml (temperature 0.8, top-p 0.95), both tests of
orchestrator/judge/sampling_stats.py as `bench compare` runs them:
  two-sample    the seed-level permutation test on each sample's mean raw logprob
  first token   each prompt's first sampled token against the reference side's next-token logprobs
                (128 candidates) after the claimed sampler, in the engine's order
  verdict       'different' when either p < alpha / 2 (Bonferroni over the two tests)
power         a deliberately different sampler that claims the reference settings: top-p 0.8 and
              temperature 1.0 instead, on other seeds
false alarms  the same settings on both sides, `--repeats` comparisons of contiguous seed blocks (seeds
              20000 + 2r*n .. +n-1 against the next n): how many reach p < 0.01 and p < 0.05
why           the old test (labels permuted sample by sample within each prompt) on the same
              comparisons, and a one-way ANOVA of the prompt-centred statistic on the seed: one seed's
              samples of different prompts are dependent (common random numbers)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from adapters import ADAPTERS  # noqa: E402
from adapters.contract.specs import LoadSpec, ModelSpec, SamplerSettings, engine_seed  # noqa: E402
from orchestrator.execution.engine_child.prompts import Tokenizer, scoring_prompts  # noqa: E402
from orchestrator.inputs.tiny_model import default_cache_root, resolve_builtin  # noqa: E402
from orchestrator.judge.sampling_stats import first_token_test, permutation_test, sampler_probs  # noqa: E402
from orchestrator.matrix.models import Measure  # noqa: E402

ALPHA = 0.01
NEXT_TOP_K = 128


SEEDING = "per-prompt"


def draw(adapter, prompts, settings: SamplerSettings, seeds: range, tokens: int, batch: int = 8) -> dict:
    pairs = [(i, s) for i in range(len(prompts)) for s in seeds]
    out = {"stat": [], "prompt": [], "seed": [], "first": []}
    for k in range(0, len(pairs), batch):
        chunk = pairs[k:k + batch]
        engine = [engine_seed(s, i) if SEEDING == "per-prompt" else s for i, s in chunk]
        for (i, s), o in zip(chunk, adapter.sample([prompts[i] for i, _ in chunk], engine, settings, tokens)):
            out["stat"].append(float(np.mean(o.logprobs)))
            out["prompt"].append(i)
            out["seed"].append(s)
            out["first"].append(int(o.token_ids[0]))
    return {k: np.array(v) for k, v in out.items()}


def within_prompt_test(a: dict, b: dict, n_perm: int = 5000, seed: int = 0) -> float:
    """The test before the seed-level one: labels permuted sample by sample within each prompt."""
    rng = np.random.default_rng(seed)
    prompts = np.unique(a["prompt"])
    observed, null = 0.0, np.zeros(n_perm)
    for p in prompts:
        x, y = a["stat"][a["prompt"] == p], b["stat"][b["prompt"] == p]
        pooled = np.concatenate([x, y])
        observed += y.mean() - x.mean()
        perm = pooled[np.argsort(rng.random((n_perm, len(pooled))), axis=1)]
        null += perm[:, :len(y)].mean(axis=1) - perm[:, len(y):].mean(axis=1)
    return float((np.sum(np.abs(null) >= abs(observed) - 1e-12) + 1) / (n_perm + 1))


def seed_anova(d: dict) -> tuple[float, float]:
    """One-way ANOVA of the prompt-centred statistic on the seed: (F, p)."""
    from scipy.stats import f_oneway

    y = d["stat"] - np.array([d["stat"][d["prompt"] == p].mean() for p in d["prompt"]])
    r = f_oneway(*[y[d["seed"] == s] for s in np.unique(d["seed"])])
    return float(r.statistic), float(r.pvalue)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default="hf", choices=["hf", "llamacpp"])
    ap.add_argument("--seeds", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=20, help="same-settings comparisons for the false-alarm rate")
    ap.add_argument("--seeding", default="per-prompt", choices=["per-prompt", "shared"],
                    help="per-prompt: the engine gets engine_seed(seed, prompt), as bench run sends it; shared: the "
                    "same engine seed for every prompt (before that fix)")
    ap.add_argument("--quick", action="store_true", help="2 prompts x 4 seeds x 4 tokens, 2 repeats, for CI")
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.prompts, args.tokens, args.repeats = 4, 2, 4, 2
    global SEEDING
    SEEDING = args.seeding

    source = resolve_builtin("tiny", default_cache_root())
    measure = Measure(scoring_prompts=args.prompts, scoring_len=64)
    prompts = scoring_prompts(measure, Tokenizer(str(source)))
    adapter = ADAPTERS[args.engine]()
    adapter.load(LoadSpec(framework=args.engine, model=ModelSpec(name="tiny", source=str(source)), quantization="fp32",
                          context_len=64 + args.tokens, cache_dir=str(default_cache_root() / "engines")))
    base = SamplerSettings(temperature=0.8, top_p=0.95)
    nxt = adapter.greedy(prompts, 1, NEXT_TOP_K)
    dists = {}
    for i, g in enumerate(nxt):
        ids, q, why = sampler_probs(g.topk_ids[0], g.topk_logprobs[0], order=adapter.sampler_order, **base.model_dump())
        dists[i] = why if why else (ids, q)
    known = sum(not isinstance(d, str) for d in dists.values())

    def compare(a: dict, b: dict) -> tuple[float, float | None, float]:
        two = permutation_test(a["stat"], a["prompt"], a["seed"], b["stat"], b["prompt"], b["seed"])
        ft = first_token_test(dists, {i: b["first"][b["prompt"] == i] for i in range(len(prompts))})
        return two.p_value, (ft.p_value if ft else None), two.shift

    n = args.seeds
    t0 = time.perf_counter()
    print(f"engine {args.engine}, {args.seeding} seeding; {args.prompts} prompts x {n} seeds x {args.tokens} tokens a "
          f"side; alpha {ALPHA}; "
          f"first-token test on {known} of {args.prompts} prompts (the others: the nucleus reaches beyond "
          f"{NEXT_TOP_K} candidates)")
    print(f"{'comparison':40} {'shift nats/tok':>14} {'two-sample p':>12} {'first-token p':>13}  verdict")
    ref = draw(adapter, prompts, base, range(0, n), args.tokens)
    for name, other in (("top_p 0.95 vs 0.8 (temperature 0.8)", SamplerSettings(temperature=0.8, top_p=0.8)),
                        ("temperature 0.8 vs 1.0 (top_p 0.95)", SamplerSettings(temperature=1.0, top_p=0.95))):
        p2, pf, shift = compare(ref, draw(adapter, prompts, other, range(10_000, 10_000 + n), args.tokens))
        verdict = "different" if min(x for x in (p2, pf) if x is not None) < ALPHA / 2 else "same distribution"
        print(f"{name:40} {shift:>+14.4f} {p2:>12.2g} {pf if pf is not None else float('nan'):>13.2g}  {verdict}")
    rows, pool = [], []
    for r in range(args.repeats):
        a = draw(adapter, prompts, base, range(20_000 + 2 * r * n, 20_000 + (2 * r + 1) * n), args.tokens)
        b = draw(adapter, prompts, base, range(20_000 + (2 * r + 1) * n, 20_000 + (2 * r + 2) * n), args.tokens)
        p2, pf, _ = compare(a, b)
        pv = min(1.0, 2 * min(x for x in (p2, pf) if x is not None))      # the verdict's p (Bonferroni)
        rows.append((p2, pf if pf is not None else np.nan, pv, within_prompt_test(a, b)))
        pool += [a, b]
    ps = np.array(rows)
    print(f"same settings, {args.repeats} comparisons of contiguous seed blocks: p < 0.01 / p < 0.05 (expected "
          f"{0.01 * args.repeats:.1f} / {0.05 * args.repeats:.1f})")
    for j, name in enumerate(("two-sample (seed-level)", "first token", "verdict (either, Bonferroni)",
                              "old: within-prompt permutation")):
        col = ps[:, j][np.isfinite(ps[:, j])]
        print(f"  {name:38} {int((col < 0.01).sum()):>3} / {int((col < 0.05).sum()):>3}   median p {np.median(col):.3f}")
    merged = {k: np.concatenate([d[k] for d in pool]) for k in pool[0]}
    f, p = seed_anova(merged)
    print(f"seed effect across prompts (one-way ANOVA of the prompt-centred statistic on the seed, "
          f"{len(np.unique(merged['seed']))} seeds x {args.prompts} prompts): F = {f:.2f}, p = {p:.2g}")
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
