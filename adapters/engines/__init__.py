"""One module per engine (hf, vllm, llamacpp, lmdeploy, trtllm) with the helpers only it uses, each
an `adapters.base.Adapter` registered under its framework name, plus the HF -> GGUF conversion
llama.cpp needs. The registry (adapters/__init__.py) imports a module the first time its framework is
looked up.

May import: adapters.base, adapters.contract, adapters.meters. Never adapters.worker or serving.
"""
