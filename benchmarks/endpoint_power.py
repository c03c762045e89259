"""Can `bench diff-endpoints --temperature` tell an fp32 llama.cpp server from a q4_0 one as a distribution,
and from how many seeds?

    python benchmarks/endpoint_power.py [--seeds 16 64 256] [--prompts 4]

Three llama-cpp-python servers on the built-in tiny model (fp32, fp32 again, q4_0; f32 KV cache, one
thread each), the prompts of tests/test_serve.py, temperature 0.8 / top-p 0.95, 16 tokens a sample.
For each seed count: fp32 vs fp32 and fp32 vs q4_0 through orchestrator.endpoint_diff.diff_sampled (the
command's own code): the two-sample test's p and shift, the first-token test's p (B's first tokens
against A's next-token logprobs after llama.cpp's sampler order), the verdict, and the seeds per
prompt the two-sample test would need for a 0.05-nat shift.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from adapters import server_process  # noqa: E402
from adapters.contract import LoadSpec, ModelSpec  # noqa: E402
from adapters.gguf_convert import gguf_for  # noqa: E402
from adapters.llamacpp import LlamacppAdapter  # noqa: E402
from orchestrator.endpoint_diff import diff_sampled  # noqa: E402
from orchestrator.tiny_model import default_cache_root, resolve_builtin  # noqa: E402

PROMPTS = ["The river ran", "Once upon a time", "In the morning the", "She said that",
           "The old clock", "At night the wind"]
KV_F32 = {"type_k": "f32", "type_v": "f32", "flash_attn": "off", "n_threads": 1}


def start(path: str, log: Path) -> server_process.ServerProcess:
    spec = LoadSpec(framework="llamacpp", model=ModelSpec(name="tiny", source=path), quantization="gguf",
                    options=KV_F32, device="cpu", context_len=128)
    port = server_process.free_port()
    return server_process.ServerProcess(LlamacppAdapter().server(spec, port), port, str(log), 180,
                                        LlamacppAdapter.server_api.health_path).start()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--prompts", type=int, default=4)
    args = ap.parse_args()
    cache = default_cache_root()
    source = resolve_builtin("tiny", cache)
    ggufs = {q: str(gguf_for(str(source), q, cache)[0]) for q in ("fp32", "q4_0")}
    logs = Path(tempfile.mkdtemp(prefix="endpoint-power-"))
    servers = {}
    t0 = time.perf_counter()
    try:
        for name, q in (("fp32", "fp32"), ("fp32_b", "fp32"), ("q4_0", "q4_0")):
            servers[name] = start(ggufs[q], logs / f"{name}.log")
        prompts = PROMPTS[: args.prompts]
        print(f"{len(prompts)} prompts, temperature 0.8, top-p 0.95, 16 tokens; alpha 0.01 (each test at 0.005)")
        print(f"{'A vs B':16} {'seeds':>5} {'same seed':>10} {'two-sample p':>12} {'shift':>8} {'first-token p':>13} "
              f"{'verdict':>18} {'seeds needed':>12}")
        for n in args.seeds:
            for b in ("fp32_b", "q4_0"):
                r = diff_sampled(servers["fp32"].url, servers[b].url, prompts, seeds=n, max_tokens=16, temperature=0.8,
                                 top_p=0.95, sampler_order=LlamacppAdapter.sampler_order, next_top_k=128)
                d, f = r["distribution"], r["first_token"]
                differing = sum(x["differing"] for x in r["per_seed"])
                print(f"{'fp32 vs ' + b:16} {n:>5} {f'{differing}/{n * len(prompts)}':>10} {d['p_value']:>12.3g} "
                      f"{d['shift']:>+8.4f} {f.get('p_value', float('nan')):>13.3g} {d['verdict']:>18} "
                      f"{d['seeds_to_detect_0.05_nats']:>12}" + (f"  first token n/a: {f['why']}" if "why" in f else "")
                      + (f"  (first token: {f['prompts']} prompts, {f['outside']} outside)" if "p_value" in f else ""),
                      flush=True)
    finally:
        for srv in servers.values():
            srv.stop()
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
