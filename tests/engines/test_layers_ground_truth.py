"""Ground truth for the layer report (issue 43, item 1): a copy of the built-in model with the weights of one
block k perturbed; transformers' per-layer hidden states against the unperturbed model must leave the floor
(transformers run twice, and against the numpy reference engine) at block k, with every block before k within."""

import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from adapters import ADAPTERS
from adapters.contract.specs import LoadSpec, ModelSpec
from orchestrator.explain.layers import floor, layer_report, relative_errors


def _loaded(framework, folder):
    adapter = ADAPTERS[framework]()
    adapter.load(LoadSpec(framework=framework, model=ModelSpec(name="tiny", source=str(folder)),
                          quantization="fp32", device="cpu"))
    return adapter


@pytest.mark.parametrize("k", [0, 1])
def test_layers_names_the_perturbed_block(k, tiny_model, tmp_path):
    copy = tmp_path / "perturbed"
    shutil.copytree(tiny_model, copy)
    (weights,) = copy.glob("*.safetensors")
    w = load_file(weights)
    name = f"model.layers.{k}.mlp.down_proj.weight"
    w[name] = w[name] * np.float32(1.05)
    save_file(w, weights, metadata={"format": "pt"})
    rng = np.random.default_rng(2)
    prompts = [list(map(int, rng.integers(3, 500, n))) for n in (16, 9)]
    base, ref = _loaded("hf", tiny_model), _loaded("numpy", tiny_model)
    runs = [base.hidden_states(prompts), base.hidden_states(prompts), ref.hidden_states(prompts)]
    cell = _loaded("hf", copy).hidden_states(prompts)
    report = layer_report(relative_errors(cell, runs[0]), floor(runs))
    assert report["first_beyond"] == k, report
    assert not report["embeddings_beyond"]
    assert all(not r["beyond_floor"] for r in report["layers"][: k + 1]), report
    assert report["grows_most"] == k
    assert report["line"].startswith(f"leaves the noise floor at layer {k}")
