"""The sampling layer's statistics: two tests on seeded samples, the sampler transform, and the seeds a
test needs.

The unit is the seed, not the sample. One seed drives every prompt's sample through the same random
stream (common random numbers: llama.cpp's dist sampler draws one uniform per token and walks the
candidates sorted by probability, so a low first uniform gives every prompt a likely first token), so
the samples of one seed are dependent across prompts. A test that treats each sample as its own unit
then under-states the noise and raises false alarms (benchmarks/README.md: 2 of 20 at p < 0.01 on
llama.cpp with contiguous seed blocks).

two-sample      each sample's mean raw logprob (each engine's log-softmax of its raw logits at the token
                it drew): a sampler that keeps more of the tail draws tokens of lower logprob, an engine
                whose logits moved moves it too. Centred per prompt and averaged per seed, the seeds of the
                two sides are exchangeable under the null, so a permutation of seed labels (the same
                relabelling for every prompt) holds its level by construction.
first token     the first sampled token of each prompt against the distribution the baseline's next-token
                logprobs imply after the cell's own sampler (temperature, top-k, top-p, min-p in the
                engine's order: `sampler_probs`, the one definition of that transform): per prompt a
                likelihood-ratio G-test whose null distribution is simulated (exact up to Monte Carlo
                error: 16 draws over tens of tokens leave expected counts far below chi-square's
                asymptotics), combined over prompts by Bonferroni (valid under any dependence; Fisher's
                method would need independent prompts, which common random numbers rule out).
whole sample    where the baseline's engine scored the cell's samples teacher forced (its top-k at every
                position): every sampled token against the baseline's distribution after the cell's own
                sampler, by its randomized probability integral transform (`whole_sample_test`); the first
                token's test over every position of every sample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from adapters.contract.seed_power import POWER, seed_units, z_sum

N_PERM = 5000
SEED = 0
SAMPLER_STEPS = ("temperature", "top_k", "top_p", "min_p")
_TAIL_EPS = 1e-6     # raw probability mass below this outside the stored candidates is none (float32 rounding)


@dataclass
class DistributionTest:
    n_base: int                   # samples
    n_cell: int
    shift: float                  # mean over seeds of the prompt-centred statistic, cell minus baseline, nats/token
    p_value: float
    seeds_base: int = 0           # the test's units
    seeds_cell: int = 0
    unit_var: float = math.nan    # the pooled variance of the per-seed means (nats/token squared)
    test: str = "seed-level permutation (per-sample mean raw logprob, centred per prompt)"

    def detectable_shift(self, level: float, power: float = POWER) -> float:
        """The smallest shift (nats/token, either sign) this test finds with `power` at `level`, at its
        seeds: normal approximation on the per-seed means (what the permutation test permutes)."""
        if not (self.seeds_base and self.seeds_cell and np.isfinite(self.unit_var)):
            return math.nan
        return float(z_sum(level, power) * math.sqrt(self.unit_var * (1 / self.seeds_base + 1 / self.seeds_cell)))


def permutation_test(base: np.ndarray, base_prompt: np.ndarray, base_seed: np.ndarray, cell: np.ndarray,
                     cell_prompt: np.ndarray, cell_seed: np.ndarray, n_perm: int = N_PERM,
                     seed: int = SEED) -> DistributionTest:
    """Two-sided: how often does a relabelling of seeds shift as far as the observed?"""
    prompts = np.intersect1d(np.unique(base_prompt), np.unique(cell_prompt))
    kb, kc = np.isin(base_prompt, prompts), np.isin(cell_prompt, prompts)
    centre = {p: float(np.concatenate([base[kb & (base_prompt == p)], cell[kc & (cell_prompt == p)]]).mean())
              for p in prompts}
    a = seed_units(base[kb], base_prompt[kb], base_seed[kb], centre)
    b = seed_units(cell[kc], cell_prompt[kc], cell_seed[kc], centre)
    if not len(a) or not len(b):
        return DistributionTest(int(kb.sum()), int(kc.sum()), math.nan, math.nan, len(a), len(b))
    rng = np.random.default_rng(seed)
    pooled = np.concatenate([a, b])
    perm = pooled[np.argsort(rng.random((n_perm, len(pooled))), axis=1)]
    null = perm[:, :len(b)].mean(axis=1) - perm[:, len(b):].mean(axis=1)
    observed = b.mean() - a.mean()
    p = (np.sum(np.abs(null) >= abs(observed) - 1e-12) + 1) / (n_perm + 1)
    dof = len(a) + len(b) - 2
    unit_var = (np.sum((a - a.mean()) ** 2) + np.sum((b - b.mean()) ** 2)) / dof if dof > 0 else math.nan
    return DistributionTest(n_base=int(kb.sum()), n_cell=int(kc.sum()), shift=float(observed), p_value=float(p),
                            seeds_base=len(a), seeds_cell=len(b), unit_var=float(unit_var))


# ------------------------------------------------------------------ the sampler transform


def kept_prefix(logprobs: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                order: tuple[str, ...] = SAMPLER_STEPS) -> tuple[int | None, str | None]:
    """How many of the most likely tokens a sampler keeps, from the raw logprobs of the K most likely
    (sorted descending; the rest of the vocabulary, mass 1 - sum, ranks below them). Every filter keeps
    a prefix of the tokens ranked by probability and temperature keeps the ranking, so the prefix length
    is the whole transform. (None, why) where the tokens beyond the K decide it."""
    p = np.exp(logprobs.astype(np.float64))
    k = len(p)
    tail = max(0.0, 1.0 - float(p.sum()))
    alive, partial = tail > _TAIL_EPS, False      # can a token beyond the K survive; only some of the tail left
    inv, tempered, m = 1.0 / temperature, False, k
    for step in order:
        if step == "temperature":
            tempered = True
            continue
        w = p[:m] ** inv if tempered else p[:m]
        if step == "top_k" and top_k:
            if top_k <= m:
                m, alive = top_k, False
            elif alive:
                partial = True
        elif step == "top_p" and top_p < 1.0:
            if alive:
                if not tempered:
                    hi = tail
                elif inv >= 1.0:         # each tail token <= p[k-1]: sum p^inv <= tail * p[k-1]^(inv-1)
                    hi = tail * p[k - 1] ** (inv - 1.0)
                else:
                    return None, (f"temperature {temperature:g} > 1 before top-p: the tail's weight is unbounded "
                                  f"without the whole vocabulary")
                lo = 0.0 if (partial or tempered) else tail
                cs = np.cumsum(w)
                cut = [int(np.searchsorted(cs, top_p * (cs[-1] + z), side="left")) + 1 for z in (lo, hi)]
                if cut[1] > m:
                    return None, f"top-p {top_p:g} reaches beyond the {k} stored candidates"
                if cut[0] != cut[1]:
                    return None, f"top-p {top_p:g}'s cut depends on the mass beyond the {k} stored candidates"
                m, alive = cut[0], False
            else:
                cs = np.cumsum(w)
                m = min(m, int(np.searchsorted(cs, top_p * cs[-1], side="left")) + 1)
        elif step == "min_p" and min_p:
            thr = min_p * w[0]
            m = max(1, int(np.sum(w >= thr)))
            if alive:
                if (p[k - 1] ** inv if tempered else p[k - 1]) >= thr:
                    return None, f"min-p {min_p:g} keeps tokens beyond the {k} stored candidates"
                alive = False
    if alive:
        return None, f"the sampler keeps tokens beyond the {k} stored candidates (no filter cuts inside them)"
    return m, None


def sampler_probs(ids: np.ndarray, logprobs: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0,
                  min_p: float = 0.0, order: tuple[str, ...] = SAMPLER_STEPS
                  ) -> tuple[np.ndarray | None, np.ndarray | None, str | None]:
    """The next-token distribution a sampler draws from, given raw logprobs of candidate ids (any order;
    -inf / id -1 padding dropped): (kept ids, their probabilities, None) or (None, None, why)."""
    keep = (ids >= 0) & np.isfinite(logprobs)
    ids, logprobs = ids[keep], logprobs[keep].astype(np.float64)
    order_ = np.lexsort((ids, -logprobs))       # the one top-k rule: by logprob, ties by the lower id
    ids, logprobs = ids[order_], logprobs[order_]
    if not len(ids):
        return None, None, "no next-token candidates stored"
    m, why = kept_prefix(logprobs, temperature, top_k, top_p, min_p, order)
    if m is None:
        return None, None, why
    z = logprobs[:m] / temperature
    q = np.exp(z - z.max())
    return ids[:m], q / q.sum(), None


@dataclass
class FirstTokenTest:
    n: int                                  # draws tested (prompts tested x seeds)
    prompts: int                            # prompts tested
    p_value: float
    outside: int = 0                        # draws of tokens the baseline's sampler never keeps
    skipped: dict[int, str] = field(default_factory=dict)   # prompt -> why its distribution is not known
    test: str = "first token: G-test per prompt (simulated null), Bonferroni over prompts"


def _g(counts: np.ndarray, expected: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return 2.0 * np.where(counts > 0, counts * np.log(counts / expected), 0.0).sum(axis=-1)


def first_token_test(dists: dict[int, tuple[np.ndarray, np.ndarray] | str], draws: dict[int, np.ndarray],
                     n_sim: int = N_PERM, seed: int = SEED) -> FirstTokenTest | None:
    """`dists`: prompt -> (kept ids, probabilities) from `sampler_probs`, or why not known; `draws`:
    prompt -> the first sampled token of each seed. None where no prompt can be tested."""
    rng = np.random.default_rng(seed)
    ps, n, outside, skipped = [], 0, 0, {}
    for prompt, x in sorted(draws.items()):
        d = dists.get(prompt, "the baseline has no samples of this prompt")
        if isinstance(d, str):
            skipped[prompt] = d
            continue
        ids, q = d
        index = {int(t): j for j, t in enumerate(ids)}
        counts = np.zeros(len(ids))
        out = 0
        for t in x:
            j = index.get(int(t))
            if j is None:
                out += 1
            else:
                counts[j] += 1
        n, outside = n + len(x), outside + out
        if out:            # impossible under the null: exactly p = 0
            ps.append(0.0)
            continue
        expected = len(x) * q
        sims = rng.multinomial(len(x), q, size=n_sim)
        ps.append(float((np.sum(_g(sims, expected) >= _g(counts, expected) - 1e-9) + 1) / (n_sim + 1)))
    if not ps:
        return None
    return FirstTokenTest(n=n, prompts=len(ps), p_value=min(1.0, len(ps) * min(ps)), outside=outside, skipped=skipped)


@dataclass
class WholeSampleTest:
    n: int                                  # positions tested
    samples: int                            # samples they come from
    p_value: float
    mean_pit: float                         # 0.5 under the null; above: the cell draws less likely tokens
    outside: int = 0                        # draws of tokens the baseline's distribution after the sampler never keeps
    skipped: int = 0                        # positions not tested: distribution unknown, or one token kept
    test: str = ("whole sample: each sampled token's randomized PIT under the baseline's teacher-forced "
                 "distribution after the cell's sampler; mean against U(0,1), z")


def whole_sample_test(positions, order: tuple[str, ...], settings: dict, seed: int = SEED) -> WholeSampleTest | None:
    """`positions`: per sample, its (candidate ids [T, K], their raw logprobs [T, K], drawn ids [T]), the
    baseline's engine scoring the sample teacher forced. At each position the baseline's next-token
    distribution after the cell's sampler (`sampler_probs`, the cell engine's order) ranks the kept tokens by
    probability; the drawn token's randomized PIT (a uniform point of its cumulative interval) is U(0,1) when the
    cell draws from that distribution, and the PITs of one sample are independent (each is uniform given
    the tokens before it), so their mean has an exact null. A draw outside the kept tokens counts as PIT 1
    (the far end), not as impossible: an engine whose logits differ by rounding may keep a boundary token
    the baseline's cut leaves out. Positions whose distribution is not known from the stored candidates, or
    that keep one token (no information), are skipped: which ones depends only on the sample's earlier tokens,
    so skipping keeps the null. None where no position can be tested."""
    rng = np.random.default_rng(seed)
    pits, outside, skipped, samples = [], 0, 0, 0
    for ids, lps, drawn in positions:
        used = False
        for t in range(len(drawn)):
            kept, q, why = sampler_probs(np.asarray(ids[t]), np.asarray(lps[t]), order=order, **settings)
            if why or len(kept) < 2:
                skipped += 1
                continue
            hit = np.flatnonzero(kept == drawn[t])
            if not len(hit):
                outside += 1
                pits.append(1.0)
            else:
                j = int(hit[0])
                pits.append(float(q[:j].sum() + rng.random() * q[j]))
            used = True
        samples += used
    if not pits:
        return None
    n = len(pits)
    mean = float(np.mean(pits))
    z = (mean - 0.5) / math.sqrt(1.0 / (12.0 * n))
    return WholeSampleTest(n=n, samples=samples, p_value=float(math.erfc(abs(z) / math.sqrt(2.0))), mean_pit=mean,
                           outside=outside, skipped=skipped)


# ------------------------------------------------------------------ two samplers' semantics

# top-k keeps the same tokens before or after temperature (temperature keeps the ranking); every other
# pair of steps gives another distribution in the other order (each renormalises what the next cuts)
_COMMUTING = {frozenset(("temperature", "top_k"))}


def active_steps(order: tuple[str, ...], temperature: float, top_k: int = 0, top_p: float = 1.0,
                 min_p: float = 0.0) -> tuple[str, ...]:
    on = {"temperature": temperature != 1.0, "top_k": top_k > 0, "top_p": top_p < 1.0, "min_p": min_p > 0.0}
    return tuple(s for s in order if on[s])


def order_difference(order: tuple[str, ...], other: tuple[str, ...], **settings) -> tuple[str, str] | None:
    """(x, y): the first pair of steps active at these settings that `order` applies x before y and
    `other` y before x, where the order changes the distribution; None where the two agree."""
    a, b = active_steps(order, **settings), active_steps(other, **settings)
    for i, x in enumerate(a):
        for y in a[i + 1:]:
            if frozenset((x, y)) not in _COMMUTING and b.index(y) < b.index(x):
                return x, y
    return None
