"""Engine adapters. Adding a framework: one file here, and its name and module below."""

from adapters.base import ADAPTERS, Adapter, register  # noqa: F401

# imported on first use (adapters.base.Registry), in this order in every "known: ..." list
ADAPTERS.modules.update({"hf": "adapters.hf", "vllm": "adapters.vllm", "trtllm": "adapters.trtllm",
                         "lmdeploy": "adapters.lmdeploy", "llamacpp": "adapters.llamacpp"})
