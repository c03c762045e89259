"""The sampling layer end to end: seeded samples through each engine's own sampler, stored per sample,
compared seed by seed where the engine promises it and as a distribution where it does not; and
speculative decoding measured, not assumed (llama.cpp's prompt lookup, vLLM's n-gram drafts on the
CPU build, whose seeded sampling under speculation is broken upstream: an unsupported null, said)."""

import copy
import json
import subprocess

import numpy as np
import pandas as pd
import pytest
import yaml

from conftest import ROOT, SMALL_MATRIX, bench_cmd
from orchestrator.analysis import analyse
from orchestrator.runner import run_matrix
from orchestrator.sampling_stats import permutation_test, seeds_to_detect
from orchestrator.sampling_verdicts import analyse_sampling
from orchestrator.store import RunStore

VLLM_PY = ROOT / ".venvs" / "vllm" / "bin" / "python"
CPU = {"enforce_eager": True, "cpu_kvcache_space_gib": 0.25}
SAMPLING = {"temperature": 0.8, "top_p": 0.95, "seeds": 16, "tokens": 16}


def test_permutation_test_level_and_power():
    rng = np.random.default_rng(0)
    strata = np.repeat(np.arange(4), 16)
    alarms = sum(permutation_test(rng.normal(size=64), strata, rng.normal(size=64), strata, n_perm=500,
                                  seed=i).p_value < 0.05 for i in range(200))
    assert alarms <= 200 * 0.05 + 3 * (200 * 0.05 * 0.95) ** 0.5     # the level holds
    shifted = permutation_test(rng.normal(size=64), strata, rng.normal(size=64) + 1.0, strata)
    assert shifted.p_value < 0.001 and shifted.shift == pytest.approx(1.0, abs=0.4)
    # seeds to find a shift of 1 at 1%, 80% power, 4 prompts of 16 values +-1 (variance 16/15):
    # 2 * 16/15 * (2.576 + 0.842)^2 / 4 = 6.23 -> 7
    assert seeds_to_detect(np.tile([-1.0, 1.0], 32), strata, 1.0, 0.01) == 7


@pytest.fixture(scope="module")
def sampling_run(ray_local, tmp_path_factory, tiny_model):
    assert VLLM_PY.exists(), f"vLLM environment missing ({VLLM_PY}): make env-vllm"
    data = copy.deepcopy(SMALL_MATRIX)
    # 64-token prompts: the workload's sentence repeats within each (its words are several tokens of
    # the tiny vocabulary), so the n-gram and prompt-lookup drafters find matches
    data["axes"] = {"framework": ["hf", "vllm"], "model": ["tiny"], "quantization": ["fp32"], "batch_size": [1, 4],
                    "flags": ["default"], "input_len": [64], "output_len": [16]}
    data["flags"] = {"vllm": {"default": CPU | {"enable_prefix_caching": True},
                              "no_prefix_cache": CPU | {"enable_prefix_caching": False},
                              "ngram": CPU | {"speculative": {"method": "ngram", "num_speculative_tokens": 3,
                                                              "prompt_lookup_max": 3}}}}
    data["flags"]["llamacpp"] = {"lookup": {"prompt_lookup": True, "num_pred_tokens": 4}}
    data["include"] = [{"framework": "vllm", "flags": f, "batch_size": 1} for f in ("no_prefix_cache", "ngram")] + \
        [{"framework": "llamacpp", "flags": f, "batch_size": 1} for f in ("default", "lookup")]
    # prompts that repeat themselves, so n-gram drafts find matches
    data["workload"] = {"kind": "jsonl", "path": str(tmp_path_factory.mktemp("w") / "p.jsonl")}
    with open(data["workload"]["path"], "w") as f:
        for i in range(8):
            f.write(json.dumps({"text": "the old town by the river and the old town by the sea " * 6}) + "\n")
    data["measure"] |= {"scoring_prompts": 4, "scoring_len": 48, "greedy_tokens": 12, "sampling": SAMPLING}
    data["run"] |= {"python": {"vllm": str(VLLM_PY)}, "cell_timeout_s": 600}
    d = tmp_path_factory.mktemp("sampling")
    (d / "m.yaml").write_text(yaml.safe_dump(data))
    store = run_matrix(d / "m.yaml", d / "run")
    return store, store.read_cells(), RunStore(store.root).read_samples().to_pandas()


def _id(cells, framework, flags="default", batch=1):
    rows = cells[(cells.framework == framework) & (cells["flags"] == flags) & (cells.batch_size == batch)]
    assert len(rows) == 1
    return rows.cell_id.iloc[0]


def test_every_cell_stores_its_seeded_samples(sampling_run):
    _, cells, samples = sampling_run
    assert set(cells.status) == {"ok"}, cells[["framework", "flags", "status", "reason"]]
    counts = samples.groupby("cell_id").size()
    spec = _id(cells, "vllm", "ngram")      # vllm-project/vllm PR #42638: said as a null with the reason
    assert "42638" in json.loads(cells.set_index("cell_id").missing[spec])["samples"]
    assert set(counts.index) == set(cells.cell_id) - {spec} and (counts == 4 * 16 * 2).all()   # prompts x seeds x repeats
    assert all(len(t) == 16 and len(lp) == 16 for t, lp in zip(samples.token_ids, samples.logprobs))
    assert (np.concatenate(samples.logprobs.to_list()) <= 0).all()
    one = samples[samples.cell_id == _id(cells, "hf")]
    assert one.groupby("prompt_index").token_ids.apply(lambda x: len({tuple(t) for t in x})).min() > 1   # seeds differ


def test_seeds_repeat_and_engines_agree_in_distribution(sampling_run):
    store, cells, _ = sampling_run
    sv = analyse_sampling(store.root).set_index("cell_id")
    assert set(sv.index) == set(cells.cell_id) - {_id(cells, "vllm", "ngram")}
    for cid in sv.index:
        assert sv.loc[cid].repeatable == 1.0, (cid, sv.loc[cid].sampling_reason)
    # hf's per-request generators: batch 4 draws exactly what batch 1 draws
    assert sv.loc[_id(cells, "hf", batch=4)].seed_verdict == "identical"
    # another engine: no seed-by-seed promise; the same model and sampler settings: the same distribution
    v = sv.loc[_id(cells, "vllm")]
    assert v.seed_verdict == "n/a" and v.sampling_verdict == "same distribution", v.sampling_reason
    assert v.dist_n_cell == v.dist_n_base == 64 and v.seeds_needed > 0


def test_vllm_seeds_are_identical_with_prefix_caching_on_and_off(sampling_run):
    store, cells, _ = sampling_run
    sv = analyse_sampling(store.root, baseline={"framework": "vllm", "flags": "no_prefix_cache"}).set_index("cell_id")
    on = sv.loc[_id(cells, "vllm")]
    assert on.seed_verdict == "identical" and on.seed_identical == 1.0, on.sampling_reason
    assert sv.loc[_id(cells, "vllm", batch=4)].seed_verdict == "identical"


def test_speculative_decoding_is_measured(sampling_run):
    store, cells, _ = sampling_run
    by_id = cells.set_index("cell_id")
    for fw, flags in (("llamacpp", "lookup"), ("vllm", "ngram")):
        spec = by_id.loc[_id(cells, fw, flags)]
        assert spec.spec_draft_tokens > 0 and 0 <= spec.spec_accepted_tokens <= spec.spec_draft_tokens, fw
        assert spec.spec_acceptance == pytest.approx(spec.spec_accepted_tokens / spec.spec_draft_tokens)
        plain = by_id.loc[_id(cells, fw)]
        assert pd.isna(plain.spec_acceptance) and pd.isna(plain.spec_draft_tokens)     # no speculation: null
        # greedy: exactly the non-speculative engine's tokens
        df = analyse(store.root, baseline={"framework": fw, "flags": "default"}).set_index("cell_id")
        assert df.loc[spec.name].greedy_match == 1.0, df.loc[spec.name].reason
    # sampled: llama.cpp samples every verified position with the same chain, so its seeds hold
    sv = analyse_sampling(store.root, baseline={"framework": "llamacpp", "flags": "default"}).set_index("cell_id")
    lookup = sv.loc[_id(cells, "llamacpp", "lookup")]
    assert lookup.seed_verdict == "identical" and lookup.sampling_verdict == "identical", lookup.sampling_reason
    assert np.isfinite(lookup.dist_p)


def test_compare_prints_a_sampling_verdict_for_every_ok_cell(sampling_run):
    store, cells, _ = sampling_run
    r = subprocess.run(bench_cmd("compare", str(store.root)), cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "COLUMNS": "250"})
    assert r.returncode == 0, r.stderr
    table = r.stdout[r.stdout.index("Sampling layer"):]
    rows = [line for line in table.splitlines() if line.startswith("│") and "/" in line]
    assert len(rows) == len(cells) - 1          # every ok cell with samples (not vLLM's n-gram: see above)
    assert all(any(v in line for v in ("identical", "same distribution", "different")) for line in rows)
