"""The vLLM adapter's server command line parsed by vLLM's own argument parser, in the vLLM environment's
interpreter (a child of its own; no Ray, no server started). Skipped without `.venvs/vllm`."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from orchestrator.execution.engine_child.supervisor import PROJECT_ROOT

HAS_VLLM = (PROJECT_ROOT / ".venvs" / "vllm" / "bin" / "python").exists()

VLLM_FLAGS_CHECK = r"""
import json, sys
from adapters.contract.specs import LoadSpec, ModelSpec
from adapters.engines.vllm.adapter import VllmAdapter
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser

options = {"enable_prefix_caching": False, "enforce_eager": True, "enable_chunked_prefill": False,
           "max_num_seqs": 7, "max_num_batched_tokens": 512, "kv_cache_dtype": "auto", "max_model_len": 256,
           "speculative": {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3},
           "cudagraph_mode": "NONE", "seed": 5, "max_logprobs": 33, "cpu_kvcache_space_gib": 0.5}
spec = LoadSpec(framework="vllm", model=ModelSpec(name="tiny", source=sys.argv[1]), quantization="fp32",
                options=options, device="cpu")
launch = VllmAdapter().server(spec, 8123)
assert launch.argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"], launch.argv
args = make_arg_parser(FlexibleArgumentParser()).parse_args(launch.argv[3:])
print(json.dumps({k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v))
                  for k, v in vars(args).items()}))
"""


@pytest.mark.skipif(not HAS_VLLM, reason="no .venvs/vllm: make env-vllm")
def test_vllm_server_flags_parse_with_vllms_own_parser(tiny_model):
    proc = subprocess.run([str(PROJECT_ROOT / ".venvs/vllm/bin/python"), "-c", VLLM_FLAGS_CHECK, str(tiny_model)],
                          capture_output=True, text=True, timeout=300,
                          env=os.environ | {"PYTHONPATH": str(PROJECT_ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    args = json.loads(proc.stdout.strip().splitlines()[-1])
    assert args["model"] == str(tiny_model) and args["port"] == 8123 and args["host"] == "127.0.0.1"
    assert args["served_model_name"] in ("['tiny']", "tiny")
    assert args["enable_prefix_caching"] is False and args["enforce_eager"] is True
    assert args["enable_chunked_prefill"] is False and args["max_num_seqs"] == 7
    assert args["max_num_batched_tokens"] == 512 and args["max_model_len"] == 256 and args["seed"] == 5
    assert args["max_logprobs"] == 33 and args["logprobs_mode"] == "raw_logprobs"
    assert args["kv_cache_memory_bytes"] == 2**29 and args["dtype"] == "float32"
    assert args["distributed_executor_backend"] == "mp" and args["generation_config"] == "vllm"
    assert "ngram" in args["speculative_config"] and "NONE" in args["compilation_config"]

