"""One folder per engine (hf, vllm, llamacpp, lmdeploy, trtllm, numpy_ref): its adapter (an
`adapters.base.Adapter` registered under its framework name, with its options, numerics flags and what the driver
reads of it) and the helpers only it uses (llama.cpp's HF -> GGUF conversion among them). The registry
(adapters/__init__.py) imports a folder the first time its framework is looked up.

May import: adapters.base, adapters.contract, adapters.meters. Never adapters.worker or serving.
"""
