"""The numpy reference engine (framework `numpy`): a Llama-architecture checkpoint evaluated in float64 with numpy
alone, one request at a time. A second implementation of the forward pass beside transformers, independent of
torch, and the example of an engine that is one folder: model.py (the forward pass), adapter.py (the Adapter with
its options, numerics flags and declarations). Registered in adapters/__init__.py."""

from adapters.engines.numpy_ref.adapter import NumpyAdapter  # noqa: F401  (its @register adds it)
