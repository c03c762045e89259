"""The numpy reference engine (adapters/engines/numpy_ref/, one folder and one registry line): in process against
transformers on the built-in model, and through `bench run` (a real Ray cluster, the worker child, the store) as
a cell judged against the transformers baseline."""

import numpy as np
import yaml

from adapters import ADAPTERS
from adapters.contract.specs import LoadSpec, ModelSpec
from orchestrator.execution.runner import run_matrix
from orchestrator.judge.verdicts import judge_run


def _loaded(framework: str, tiny_model):
    adapter = ADAPTERS[framework]()
    adapter.load(LoadSpec(framework=framework, model=ModelSpec(name="tiny", source=str(tiny_model)),
                          quantization="fp32", device="cpu"))
    return adapter


def test_numpy_forward_pass_equals_transformers_within_fp32_rounding(tiny_model):
    ref, hf = _loaded("numpy", tiny_model), _loaded("hf", tiny_model)
    rng = np.random.default_rng(0)
    prompts = [list(map(int, rng.integers(3, 500, n))) for n in (24, 9, 17)]
    for a, b in zip(ref.score(prompts, 16), hf.score(prompts, 16)):
        assert np.abs(a.logprobs - b.logprobs).max() < 1e-4       # float64 against transformers' float32
        assert (a.topk_ids[:, 0] == b.topk_ids[:, 0]).all()
    for a, b in zip(ref.greedy(prompts, 8, 4), hf.greedy(prompts, 8, 4)):
        assert (a.token_ids == b.token_ids).all()
    run = ref.generate(prompts, 6, ignore_eos=True)
    assert [r.output_tokens for r in run.requests] == [6, 6, 6]
    assert all(run.start <= r.chunk_times[0] and r.chunk_times == sorted(r.chunk_times) for r in run.requests)
    ref.close()
    hf.close()


def test_a_cell_runs_on_it_through_the_worker_and_is_judged(ray_local, tiny_model, tmp_path):
    matrix = {"name": "numpy-ref", "models": {"tiny": "builtin:tiny"},
              "axes": {"framework": ["hf", "numpy"], "model": ["tiny"], "quantization": ["fp32"], "batch_size": [1],
                       "input_len": [16], "output_len": [4]},
              "measure": {"warmup": 0, "repeats": 2, "scoring_prompts": 2, "scoring_len": 24, "greedy_tokens": 4},
              "baseline": {"framework": "hf", "quantization": "fp32"}}
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(matrix))
    store = run_matrix(path, tmp_path / "run")
    cells = store.read_cells().set_index("framework")
    assert cells.loc["numpy", "status"] == "ok", cells.loc["numpy", "reason"]
    assert cells.loc["numpy", "output_tok_s"] > 0
    v = judge_run(store.root).cells.set_index("framework")
    assert v.loc["numpy", "verdict"] in ("identical", "lossless"), v.loc["numpy", "verdict_reason"]
    assert v.loc["numpy", "max_abs"] < 1e-4 and v.loc["numpy", "greedy_match"] == 1.0


def test_hidden_states_per_layer_agree_with_transformers(tiny_model):
    """Adapter.hidden_states: [layers + 1, positions, hidden] per prompt, the same residual stream in both engines."""
    ref, hf = _loaded("numpy", tiny_model), _loaded("hf", tiny_model)
    rng = np.random.default_rng(1)
    prompts = [list(map(int, rng.integers(3, 500, n))) for n in (12, 5)]
    for p, a, b in zip(prompts, ref.hidden_states(prompts), hf.hidden_states(prompts)):
        assert a.shape == b.shape and a.shape[:2] == (ref.model.cfg.layers + 1, len(p))
        for layer in range(a.shape[0]):
            rel = np.linalg.norm(a[layer] - b[layer]) / np.linalg.norm(b[layer])
            assert rel < 1e-4, (layer, rel)
    ref.close()
    hf.close()
