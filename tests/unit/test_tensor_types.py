"""llama.cpp's `tensor_types` option and the probe matrix of `bench explain --sensitivity`, without an engine: what
a matrix may name, that the overrides are part of a cell's identity, and which cells the sensitivity refuses.
The quantized files themselves (gguf-py read-back) and the probes' KLs: tests/e2e/test_sensitivity.py."""

from __future__ import annotations

import pydantic
import pytest

from adapters import ADAPTERS
from adapters.contract.specs import ModelFacts
from orchestrator.explain.sensitivity import ALL, check_cell, matrix_data, probe_configs
from orchestrator.matrix.cells import expand
from orchestrator.matrix.validate import parse_matrix

GROUPS = [{"group": g, "pattern": f"^{g.replace('.', chr(92) + '.')}\\.weight$", "type": t, "tensors": 1,
           "bytes": b, "f32_bytes": 4 * b} for g, t, b in
          (("token_embd", "q4_0", 100), ("blk.0.attn_q", "q4_0", 10), ("output", "q8_0", 50))]
CELL = {"cell_id": "c0ffee", "framework": "llamacpp", "model": "tiny", "quantization": "q4_0", "flags": "default",
        "batch_size": 1, "input_len": 16, "output_len": 4, "mode": "offline"}


def _matrix(flags: dict) -> dict:
    return {"name": "t", "models": {"tiny": "builtin:tiny"},
            "axes": {"framework": ["llamacpp"], "model": ["tiny"], "quantization": ["q4_0"], "batch_size": [1],
                     "flags": ["default", *flags], "input_len": [16], "output_len": [4]},
            "flags": {"llamacpp": flags}}


def test_tensor_types_is_checked_and_part_of_the_cell_id():
    Options = ADAPTERS["llamacpp"].Options
    assert Options(tensor_types={r"^blk\.0\.": "q8_0", ".": "f32"}).tensor_types == {r"^blk\.0\.": "q8_0", ".": "f32"}
    with pytest.raises(pydantic.ValidationError, match="regular expression"):
        Options(tensor_types={"blk.(": "q8_0"})
    with pytest.raises(pydantic.ValidationError, match="must be one of"):
        Options(tensor_types={".": "q4_k_m"})          # a level (a mixture), not a ggml type
    m = parse_matrix(_matrix({"a": {"tensor_types": {"attn": "q8_0", ".": "f32"}},
                              "b": {"tensor_types": {".": "f32", "attn": "q8_0"}}}), "t.yaml")
    ids = {c.flags: c.cell_id for c in expand(m)}
    assert len(set(ids.values())) == 3                # order matters (the first match wins): another file, another cell
    with pytest.raises(Exception, match="tensor_types"):
        parse_matrix(_matrix({"bad": {"tensor_types": {".": "q9"}}}), "t.yaml")


def test_tensor_types_needs_a_quantized_level():
    facts = ModelFacts(source="/m", kind="dir", config={"architectures": ["LlamaForCausalLM"]})
    why = ADAPTERS["llamacpp"].model_problem(facts, "fp32", {"tensor_types": {".": "q8_0"}}, "cpu")
    assert why and "quantized level" in why


def test_the_probe_matrix_is_one_cell_per_group_against_fp32():
    configs = probe_configs(GROUPS, {"type_k": "f32"})
    assert list(configs) == ["xs-token_embd", "xs-blk.0.attn_q", "xs-output", f"xs-{ALL}"]
    _, opts = configs["xs-blk.0.attn_q"]
    assert opts == {"type_k": "f32", "tensor_types": {r"^blk\.0\.attn_q\.weight$": "q4_0", ".": "f32"}}
    every, all_opts = configs[f"xs-{ALL}"]
    assert every["bytes"] == 160 and every["type"] == "q4_0+q8_0" and list(all_opts["tensor_types"])[-1] == "."
    data = matrix_data(parse_matrix(_matrix({}), "t.yaml"), CELL, {}, {n: o for n, (_, o) in configs.items()})
    cells = expand(parse_matrix(data, "sensitivity.yaml"))
    assert sorted((c.quantization, c.flags) for c in cells) == sorted(
        [("fp32", "default")] + [("q4_0", n) for n in configs])
    assert data["baseline"] == {"framework": "llamacpp", "quantization": "fp32", "flags": "default", "mode": "offline"}
    assert data["measure"]["repeats"] == 1 and data["tasks"] == []


@pytest.mark.parametrize("change, why", [({"framework": "hf"}, "llama.cpp's quantizer"),
                                         ({"quantization": "fp16"}, "quantized cell")])
def test_sensitivity_refuses_what_it_cannot_probe(change, why):
    with pytest.raises(ValueError, match=why):
        check_cell(CELL | change, {})
    with pytest.raises(ValueError, match="already names tensor_types"):
        check_cell(CELL, {"tensor_types": {".": "f32"}})


def test_recipe_candidates_keep_the_most_sensitive_per_weight_first():
    from orchestrator.explain.recipe import Candidate, candidate_types, keep_type, rank, summary
    from orchestrator.explain.sensitivity import GroupProbe

    probes = [GroupProbe(**g, kl_mean=kl) for g, kl in zip(GROUPS, (1e-2, 5e-3, None))]
    probes.append(GroupProbe(group=ALL, type="q4_0+q8_0", kl_mean=3e-2))
    ranked = rank(probes)
    assert [g.group for g in ranked] == ["blk.0.attn_q", "token_embd", "output"]   # 5e-3/40 > 1e-2/400; no KL last
    assert candidate_types(ranked, 1, keep_type("q4_0")) == {
        r"^blk\.0\.attn_q\.weight$": "q8_0", r"^token_embd\.weight$": "q4_0", r"^output\.weight$": "q8_0", ".": "f32"}
    assert keep_type("q8_0") == "f16"
    ok = {"status": "ok", "mean_within": True, "within_budget": True}
    recipe = Candidate(name="recipe", quantization="q4_0", file_bytes=100, kl_mean=4e-3, kl_lo=3e-3, kl_hi=4.5e-3, **ok)
    q8 = Candidate(name="q8_0", quantization="q8_0", file_bytes=150, kl_mean=3e-4, kl_lo=2e-4, kl_hi=4e-4, **ok)
    q4 = Candidate(name="q4_0", quantization="q4_0", file_bytes=90, kl_mean=3e-2, kl_lo=2e-2, kl_hi=4e-2, status="ok")
    assert "smaller than every preset that meets it: q8_0" in summary(recipe, [q8, q4], 5e-3)
    assert "none beats the presets: q8_0" in summary(recipe.model_copy(update={"file_bytes": 150}), [q8, q4], 5e-3)
    assert "no preset is within the budget" in summary(recipe, [q4], 5e-3)
    assert "no candidate" in summary(None, [q8], 1e-5)
