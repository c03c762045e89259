"""TensorRT-LLM's LLM API, PyTorch backend (adapter.py), CUDA only."""

from adapters.engines.trtllm.adapter import TrtllmAdapter  # noqa: F401  (its @register adds it)
