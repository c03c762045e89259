"""The sampling layer's statistics and sampler, by hand: the seed-level permutation test holds its level
and has its power, the first-token test likewise, and the sampler transform matches transformers' own
warpers and every engine's filter order. (Seeded samples through the real engines: e2e/test_sampling.py,
engines/test_sampling_engines.py.)"""

import numpy as np
import pytest

from adapters.contract.seed_power import seeds_to_detect
from orchestrator.judge.sampling_stats import (
    SAMPLER_STEPS,
    first_token_test,
    order_difference,
    permutation_test,
    sampler_probs,
    whole_sample_test,
)
from adapters import ADAPTERS
from orchestrator.judge.seed_promises import promise_for, seed_promise


def test_permutation_test_level_and_power():
    """Seeds are the units: a seed effect shared by every prompt (common random numbers) would make a test
    that permutes sample by sample cry wolf; the seed-level permutation holds its level with it."""
    rng = np.random.default_rng(0)
    strata, seeds = np.repeat(np.arange(4), 16), np.tile(np.arange(16), 4)

    prompt_effect = np.repeat(rng.normal(size=4) * 2, 16)

    def side():   # the prompts' own levels, a strong seed effect shared across prompts, and noise
        return prompt_effect + np.tile(rng.normal(size=16), 4) + 0.5 * rng.normal(size=64)

    ps = np.array([permutation_test(side(), strata, seeds, side(), strata, seeds + 100, n_perm=200, seed=i).p_value
                   for i in range(150)])
    assert (ps < 0.05).sum() <= 150 * 0.05 + 3 * (150 * 0.05 * 0.95) ** 0.5     # the level holds
    shifted = permutation_test(rng.normal(size=64), strata, seeds, rng.normal(size=64) + 1.0, strata, seeds)
    assert shifted.p_value < 0.001 and shifted.shift == pytest.approx(1.0, abs=0.4)
    assert (shifted.n_base, shifted.n_cell, shifted.seeds_base, shifted.seeds_cell) == (64, 64, 16, 16)
    # per-seed means of +-1 values alternating by seed: variance 16/15 across 16 seeds; a shift of 1 at 1%,
    # 80% power: 2 * 16/15 * (2.576 + 0.842)^2 = 24.9 -> 25 seeds
    assert seeds_to_detect(np.tile([-1.0, 1.0], 32), strata, seeds, 1.0, 0.01) == 25


def _reference_sampler(lp: np.ndarray, t: float, top_k: int, top_p: float, min_p: float, order) -> np.ndarray:
    """Each filter on the whole vocabulary in the given order: the plain definition, for checking."""
    w, tempered = np.exp(lp), False
    keep = np.ones(len(lp), bool)
    for step in order:
        cur = np.where(keep, np.exp(lp / t) if tempered else np.exp(lp), 0.0)
        cur /= cur.sum()
        if step == "temperature":
            tempered = True
        elif step == "top_k" and top_k:
            keep &= cur >= np.sort(cur)[::-1][top_k - 1]
        elif step == "top_p" and top_p < 1:
            s = np.sort(cur)[::-1]
            keep &= cur >= s[np.searchsorted(np.cumsum(s), top_p) if np.cumsum(s)[-1] >= top_p else len(s) - 1]
        elif step == "min_p" and min_p:
            keep &= cur >= min_p * cur.max()
    w = np.where(keep, np.exp(lp / t), 0.0)
    return w / w.sum()


def test_sampler_transform_matches_the_engines_filters():
    """sampler_probs against transformers' own warpers (temperature -> top_k -> top_p -> min_p) and, for
    every engine order, against the plain definition; truncated to 40 candidates it either gives the same
    distribution or says why the tail decides it."""
    import torch
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    from adapters import ADAPTERS

    rng = np.random.default_rng(1)
    orders = {fw: ADAPTERS[fw].sampler_order for fw in ("hf", "llamacpp", "vllm")}
    told = 0
    for trial in range(30):
        logits = rng.normal(size=300) * rng.uniform(0.5, 4)
        lp = logits - np.log(np.exp(logits).sum())
        t, k = float(rng.choice([0.5, 0.8, 1.0, 1.3])), int(rng.choice([0, 5, 50]))
        p, m = float(rng.choice([1.0, 0.9, 0.5])), float(rng.choice([0.0, 0.05, 0.2]))
        s = torch.tensor(lp, dtype=torch.float64)[None]
        for w in [TemperatureLogitsWarper(t)] + ([TopKLogitsWarper(k)] if k else []) + \
                ([TopPLogitsWarper(p)] if p < 1 else []) + ([MinPLogitsWarper(m)] if m else []):
            s = w(None, s)
        want = {"hf": torch.softmax(s, -1)[0].numpy()}
        want |= {fw: _reference_sampler(lp, t, k, p, m, orders[fw]) for fw in ("llamacpp", "vllm")}
        assert np.abs(want["hf"] - _reference_sampler(lp, t, k, p, m, orders["hf"])).max() < 1e-9
        top = np.argsort(-lp)[:40]
        for fw, ref in want.items():
            ids, q, why = sampler_probs(np.arange(300), lp, t, k, p, m, orders[fw])
            assert why is None
            got = np.zeros(300)
            got[ids] = q
            assert np.abs(got - ref).max() < 1e-9, (fw, t, k, p, m)
            ids, q, why = sampler_probs(top, lp[top], t, k, p, m, orders[fw])
            if why is None:
                got = np.zeros(300)
                got[ids] = q
                assert np.abs(got - ref).max() < 1e-9, ("truncated", fw, t, k, p, m)
            else:
                told += 1
                assert "stored candidates" in why or "unbounded" in why
    assert told > 0       # the truncated case was exercised


def test_first_token_test_level_and_power():
    rng = np.random.default_rng(7)
    ids, q = np.arange(5), np.array([0.5, 0.3, 0.1, 0.05, 0.05])
    dists = {i: (ids, q) for i in range(4)}
    ps = np.array([first_token_test(dists, {i: rng.choice(5, size=16, p=q) for i in range(4)}, n_sim=200,
                                    seed=r).p_value for r in range(200)])
    assert (ps < 0.05).sum() <= 200 * 0.05 + 3 * (200 * 0.05 * 0.95) ** 0.5     # Bonferroni over prompts: conservative
    wrong = first_token_test(dists, {i: rng.choice(5, size=64, p=[0.2, 0.2, 0.2, 0.2, 0.2]) for i in range(4)})
    assert wrong.p_value < 0.01 and wrong.n == 256 and wrong.prompts == 4
    # a token the baseline's sampler never keeps: impossible under the null, p = 0 exactly
    out = first_token_test(dists, {0: np.array([0, 1, 9])})
    assert out.p_value == 0.0 and out.outside == 1
    # a prompt whose distribution is not known is said, not tested
    t = first_token_test({0: (ids, q), 1: "top-p 0.95 reaches beyond the 8 stored candidates"},
                         {0: np.zeros(4, int), 1: np.zeros(4, int)})
    assert t.prompts == 1 and "beyond" in t.skipped[1]



def _samples(rng, n_samples, n_tokens, order, noise=0.0, vocab=40, k=32, settings=None):
    """Sequences drawn token by token by a sampler in `order` from a model whose logits at each position are
    the baseline's plus `noise`; returns what the baseline's engine would store teacher forced: its top-k
    (ids, raw logprobs) at each position and the drawn ids."""
    settings = settings or {"temperature": 0.8, "top_p": 0.9}
    out = []
    for _ in range(n_samples):
        ids, lps, drawn = [], [], []
        for _ in range(n_tokens):
            logits = rng.normal(0, 2.0, vocab)
            base = logits - np.log(np.exp(logits).sum())
            cell = base + rng.normal(0, noise, vocab) if noise else base
            cell = cell - np.log(np.exp(cell).sum())
            top = np.argsort(-base)[:k]
            kept, q, why = sampler_probs(np.arange(vocab), cell, order=order, **settings)
            assert why is None
            drawn.append(int(rng.choice(kept, p=q)))
            ids.append(top)
            lps.append(base[top].astype(np.float32))
        out.append((np.stack(ids), np.stack(lps), np.array(drawn)))
    return out


def test_whole_sample_test_holds_its_level_and_sees_a_model_change():
    rng = np.random.default_rng(11)
    settings = {"temperature": 0.8, "top_k": 0, "top_p": 0.9, "min_p": 0.0}
    hf, llamacpp = ("temperature", "top_k", "top_p", "min_p"), ("top_k", "top_p", "min_p", "temperature")
    # the null: the cell draws from the baseline's model after its own sampler (here llama.cpp's order)
    ps = np.array([whole_sample_test(_samples(rng, 8, 8, llamacpp, settings=settings), llamacpp, settings, seed=r).p_value
                   for r in range(200)])
    assert (ps < 0.05).sum() <= 200 * 0.05 + 3 * (200 * 0.05 * 0.95) ** 0.5
    assert 0.3 < np.mean(ps) < 0.7                                   # about uniform
    # logits moved (noise 1.0 nats on every token): found on 16 samples of 16 tokens
    moved = whole_sample_test(_samples(rng, 16, 16, hf, noise=1.0, settings=settings), hf, settings)
    assert moved.p_value < 0.001 and moved.mean_pit > 0.5 and moved.n + moved.skipped == 256
    # a token outside the baseline's kept ones is the far end of the scale (PIT 1), not an impossibility
    one = _samples(rng, 1, 4, hf, settings=settings)
    ids, lps, drawn = one[0]
    drawn = drawn.copy()
    drawn[0] = ids[0][-1]           # the least likely candidate: outside a 0.9 nucleus
    t = whole_sample_test([(ids, lps, drawn)], hf, settings)
    assert t.outside == 1 and 0 < t.p_value <= 1
    # no position with a known distribution: None
    assert whole_sample_test([(ids[:, :1], lps[:, :1], drawn)], hf, settings) is None


def test_detectable_shift_is_what_the_test_finds_with_80_percent_power():
    """The 'could have seen' figure of a 'not distinguishable': at that shift the permutation test rejects
    in about 80% of simulated comparisons at its level; at a third of it, far less often."""
    rng = np.random.default_rng(3)
    strata, seeds = np.repeat(np.arange(4), 16), np.tile(np.arange(16), 4)

    prompt_effect = np.repeat(rng.normal(size=4), 16)    # the same prompts on both sides

    def side(shift=0.0):
        return prompt_effect + np.tile(rng.normal(size=16), 4) * 0.5 + 0.3 * rng.normal(size=64) + shift

    level = 0.005
    probe = permutation_test(side(), strata, seeds, side(), strata, seeds + 100, n_perm=200)
    mde = probe.detectable_shift(level)
    assert 0 < mde < 2 and np.isfinite(probe.unit_var)
    hits = [permutation_test(side(), strata, seeds, side(mde), strata, seeds + 100, n_perm=1000, seed=i).p_value < level
            for i in range(60)]
    small = [permutation_test(side(), strata, seeds, side(mde / 3), strata, seeds + 100, n_perm=1000, seed=i).p_value
             < level for i in range(60)]
    assert 0.55 <= np.mean(hits) <= 0.97 and np.mean(small) < 0.35, (np.mean(hits), np.mean(small))
    # four times the seeds: half the shift (the figure shrinks with the square root of the seeds)
    s64, p64 = np.tile(np.arange(64), 4), np.repeat(np.arange(4), 64)
    wide = permutation_test(rng.normal(size=256) * 0.5, p64, s64, rng.normal(size=256) * 0.5, p64, s64 + 100, n_perm=50)
    narrow = permutation_test(rng.normal(size=64) * 0.5, strata, seeds, rng.normal(size=64) * 0.5, strata, seeds + 100,
                              n_perm=50)
    assert wide.seeds_base == 64 and wide.detectable_shift(level) == pytest.approx(narrow.detectable_shift(level) / 2,
                                                                                 rel=0.35)


def test_the_order_of_the_sampler_steps_matters_only_where_the_distribution_changes():
    llama, hf = ("top_k", "top_p", "min_p", "temperature"), SAMPLER_STEPS
    assert order_difference(llama, hf, temperature=0.8, top_p=0.95) == ("top_p", "temperature")
    assert order_difference(llama, hf, temperature=1.0, top_p=0.95) is None       # no temperature: one order
    assert order_difference(llama, hf, temperature=0.8, top_k=40) is None         # top-k keeps the ranking
    assert order_difference(llama, hf, temperature=0.8) is None
    # and the transform agrees: the kept sets differ at T 0.8 / top-p 0.95, not at T 1
    lp = np.log(np.array([0.5, 0.2, 0.1, 0.08, 0.06, 0.04, 0.02]))
    ids = np.arange(7)
    a, _, _ = sampler_probs(ids, lp, 0.8, top_p=0.95, order=llama)
    b, _, _ = sampler_probs(ids, lp, 0.8, top_p=0.95, order=hf)
    assert len(a) > len(b)
    assert len(sampler_probs(ids, lp, 1.0, top_p=0.95, order=llama)[0]) == len(sampler_probs(ids, lp, 1.0, top_p=0.95,
                                                                                            order=hf)[0])


def test_seed_promises_follow_each_engines_documentation():
    assert {f for f in ADAPTERS if ADAPTERS[f].seed_promises} == {"hf", "llamacpp", "vllm"}
    assert promise_for("vllm", {"vllm": "0.32.0"}).across_batch is False
    assert promise_for("vllm", {"vllm": "0.40.0"}) is None                    # a version nobody has read
    assert promise_for("trtllm", {"tensorrt_llm": "1.0"}) is None
    ok, why = seed_promise("vllm", {"vllm": "0.32.0+cpu"}, 4, 1)
    assert not ok and "NVIDIA, AMD and Intel XPU" in why
    ok, why = seed_promise("llamacpp", {"llama_cpp_python": "0.3.16"}, 1, 1)
    assert ok and "promised" in why
    ok, why = seed_promise("hf", float("nan"), 1, 1)                           # a cell without versions
    assert not ok and "no documented seed promise" in why
