"""LMDeploy (adapter.py): TurboMind and PyTorch engines, CUDA only."""

from adapters.engines.lmdeploy.adapter import LmdeployAdapter  # noqa: F401  (its @register adds it)
