"""Can `bench diff-endpoints --temperature` tell an fp32 llama.cpp server from a q4_0 one as a distribution,
and from how many seeds? And how often does it call two identical servers different?

    python benchmarks/endpoint_power.py [--seeds 16 64] [--prompts 4] [--null-runs 10] [--null-seeds 16]
                                        [--null-start 0] [--lr-null-runs 10]
    python benchmarks/endpoint_power.py --quick   # 2 prompts, 4 seeds, one run of each part (CI)

Three llama-cpp-python servers on the built-in tiny model (fp32, fp32 again, q4_0; f32 KV cache, one
thread each), the prompts of tests/e2e/test_serve.py, temperature 0.8 / top-p 0.95, 16 tokens a sample,
all through orchestrator.endpoints.diff.diff_sampled (the command's own code):
- false alarms: `--null-runs` comparisons of fp32 against fp32 again, each side on seeds of its own (A
  seeds 2k*n.., B (2k+1)*n.. for run k: identical servers with the same seeds draw identical samples),
  the count of each test's p below 0.01 and 0.05 and of `different` verdicts;
- power: fp32 vs q4_0 at each of `--seeds`: each test's p (two-sample under A, likelihood ratio, first
  token), the likelihood ratio's shift, and the verdict;
- the likelihood ratio's level where its scores are not all 0: `--lr-null-runs` comparisons of two seed
  blocks of the fp32 server's samples (the null holds: one server), each sample scored under fp32 and
  under q4_0 (log p_fp32 - log p_q4_0), the same permutation test (endpoint_diff's own scoring).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from adapters.contract.specs import LoadSpec, ModelSpec  # noqa: E402
from adapters.engines.llamacpp.gguf_convert import gguf_for  # noqa: E402
from adapters.engines.llamacpp.adapter import LlamacppAdapter  # noqa: E402
from adapters.serving import server_process  # noqa: E402
from orchestrator.inputs.tiny_model import default_cache_root, resolve_builtin  # noqa: E402
from orchestrator.endpoints.diff import _score_all, diff_sampled, echo_alignment, fetch_samples  # noqa: E402
from orchestrator.judge.sampling_stats import permutation_test  # noqa: E402

PROMPTS = ["The river ran", "Once upon a time", "In the morning the", "She said that",
           "The old clock", "At night the wind"]
KV_F32 = {"type_k": "f32", "type_v": "f32", "flash_attn": "off", "n_threads": 1}
NAN = float("nan")


def start(path: str, log: Path) -> server_process.ServerProcess:
    spec = LoadSpec(framework="llamacpp", model=ModelSpec(name="tiny", source=path), quantization="gguf",
                    options=KV_F32, device="cpu", context_len=128)
    port = server_process.free_port()
    return server_process.ServerProcess(LlamacppAdapter().server(spec, port), port, str(log), 180,
                                        LlamacppAdapter.server_api.health_path).start()


def row(name: str, n: int, r: dict) -> dict:
    d, f, lr = r["distribution"], r["first_token"], r["likelihood_ratio"]
    ps = {"two-sample": d.get("p_value", NAN), "likelihood ratio": lr.get("p_value", NAN),
          "first token": f.get("p_value", NAN)}
    print(f"{name:22} {n:>5} {ps['two-sample']:>12.3g} {ps['likelihood ratio']:>8.3g} {lr.get('shift', NAN):>+9.3f} "
          f"{lr.get('shift_per_token', NAN):>+9.4f} {ps['first token']:>13.3g} {d['verdict']:>18}"
          + (f"  LR n/a: {lr['why']}" if "why" in lr else ""), flush=True)
    return ps | {"verdict": d["verdict"] == "different"}


def lr_null(servers: dict, prompts: list[str], n: int, runs: int) -> None:
    import numpy as np

    sampler = {"temperature": 0.8, "top_p": 0.95, "top_k": 0}
    align = {e: echo_alignment(servers[e].url, prompts)[0] for e in ("fp32", "q4_0")}
    ps, shifts = [], []
    for k in range(runs):
        outs = {e: fetch_samples(servers["fp32"].url, prompts, n, 16, sampler, first_seed=(2 * k + j) * n)
                for j, e in enumerate(("A", "B"))}
        sc = {e: _score_all(servers[e].url, prompts, outs, align[e], 120.0) for e in ("fp32", "q4_0")}
        rows = {side: [(i, s, sum(sc["fp32"][side][i][s]) - sum(sc["q4_0"][side][i][s]))
                       for i in range(len(prompts)) for s in range(n)] for side in outs}
        (ia, da, la), (ib, db, lb) = (tuple(np.array(x) for x in zip(*rows[e])) for e in ("A", "B"))
        t = permutation_test(la, ia, da, lb, ib, db)
        ps.append(t.p_value)
        shifts.append(t.shift)
        print(f"  LR null run {k}: fp32 seeds {2 * k * n}.. vs {(2 * k + 1) * n}.., scored log p_fp32 - log p_q4_0: "
              f"p {t.p_value:.3g}, shift {t.shift:+.3f} nats/sample, per-sample sd {np.std(np.concatenate([la, lb])):.3f}",
              flush=True)
    print(f"likelihood ratio with non-zero scores, {runs} null comparisons: p < 0.01 / p < 0.05: "
          f"{sum(p < 0.01 for p in ps)} / {sum(p < 0.05 for p in ps)} (expected {runs * 0.01:g} / {runs * 0.05:g}); "
          f"median p {np.median(ps):.3g}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="*", default=[16, 64])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--null-runs", type=int, default=10)
    ap.add_argument("--null-seeds", type=int, default=16)
    ap.add_argument("--null-start", type=int, default=0, help="the first null run (k); runs are deterministic in k")
    ap.add_argument("--lr-null-runs", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="2 prompts, 4 seeds, one comparison of each part, for CI")
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.prompts, args.null_runs, args.null_seeds, args.lr_null_runs = [4], 2, 1, 4, 1
    cache = default_cache_root()
    source = resolve_builtin("tiny", cache)
    ggufs = {q: str(gguf_for(str(source), q, cache)[0]) for q in ("fp32", "q4_0")}
    logs = Path(tempfile.mkdtemp(prefix="endpoint-power-"))
    servers = {}
    t0 = time.perf_counter()
    kw = dict(max_tokens=16, temperature=0.8, top_p=0.95, sampler_order=LlamacppAdapter.sampler_order, next_top_k=128)
    try:
        for name, q in (("fp32", "fp32"), ("fp32_b", "fp32"), ("q4_0", "q4_0")):
            servers[name] = start(ggufs[q], logs / f"{name}.log")
        prompts = PROMPTS[: args.prompts]
        print(f"{len(prompts)} prompts, temperature 0.8, top-p 0.95, 16 tokens; alpha 0.01 over the tests run "
              f"(Bonferroni: each at 0.0033 with three)")
        print(f"{'A vs B':22} {'seeds':>5} {'two-sample p':>12} {'LR p':>8} {'LR shift':>9} {'per token':>9} "
              f"{'first-token p':>13} {'verdict':>18}")
        for n in args.seeds:
            row("fp32 vs q4_0", n, diff_sampled(servers["fp32"].url, servers["q4_0"].url, prompts, seeds=n, **kw))
        n = args.null_seeds
        nulls = [row(f"fp32 vs fp32_b, run {k}", n,
                     diff_sampled(servers["fp32"].url, servers["fp32_b"].url, prompts, seeds=n,
                                  first_seed=(2 * k * n, (2 * k + 1) * n), **kw))
                 for k in range(args.null_start, args.null_start + args.null_runs)]
        print(f"false alarms over {len(nulls)} comparisons of identical servers (different seeds), "
              f"p < 0.01 / p < 0.05 (expected {len(nulls) * 0.01:g} / {len(nulls) * 0.05:g}):")
        for test in ("two-sample", "likelihood ratio", "first token"):
            ps = [x[test] for x in nulls]
            print(f"  {test:18} {sum(p < 0.01 for p in ps):>3} / {sum(p < 0.05 for p in ps):>3}   "
                  f"p: {', '.join(f'{p:.2g}' for p in ps)}")
        if nulls:
            print(f"  verdict different  {sum(x['verdict'] for x in nulls):>3}")
        if args.lr_null_runs:
            lr_null(servers, prompts, n, args.lr_null_runs)
    finally:
        for srv in servers.values():
            srv.stop()
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
