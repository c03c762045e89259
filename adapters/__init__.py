"""Engine adapters. Adding a framework: one file here, and its name and module below."""

from adapters.base import ADAPTERS, Adapter, register  # noqa: F401

# imported on first use (adapters.base.Registry), in this order in every "known: ..." list
ADAPTERS.modules.update({"hf": "adapters.engines.hf", "vllm": "adapters.engines.vllm", "trtllm": "adapters.engines.trtllm",
                         "lmdeploy": "adapters.engines.lmdeploy", "llamacpp": "adapters.engines.llamacpp",
                         "numpy": "adapters.engines.numpy_ref"})
