"""llama.cpp through llama-cpp-python (adapter.py): the HF -> GGUF conversion by llama.cpp's own converter
(gguf_convert.py, run in a child: converter_child.py), the native context calls (native.py), batched decoding
(batched.py) and prompt-lookup decoding one sequence at a time (sequential.py)."""

from adapters.engines.llamacpp.adapter import LlamacppAdapter  # noqa: F401  (its @register adds it)
