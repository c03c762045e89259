"""llamacpp adapter: not written yet; its cells become `unsupported` rows that say so."""

from adapters.base import Adapter, register


@register
class LlamacppAdapter(Adapter):
    name = "llamacpp"
    quantizations = ("fp32", "fp16", "bf16")

    def check(self, spec):
        return "the llamacpp adapter is not implemented in this version of lossless-bench"
