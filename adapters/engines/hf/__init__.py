"""Hugging Face transformers, the reference engine (adapter.py): CPU and CUDA, fp32/fp16/bf16."""

from adapters.engines.hf.adapter import HfAdapter  # noqa: F401  (its @register adds it)
