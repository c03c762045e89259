"""The sampling layer's verdict, end to end: its false alarms between identical engines, its power against
changes that move the distribution, at fixed seeds and at `seeds: auto`, and what it says across engines.

    python benchmarks/sampling_verdicts.py [--offsets 20] [--seeds 16] [--out DIR]
    python benchmarks/sampling_verdicts.py --quick --out DIR   # one offset, 4 seeds, auto up to 8 (CI)

Everything runs through `bench run` (a real local Ray cluster, real engines on the built-in tiny model)
and is judged by `analyse_sampling`, as `bench compare` prints it. Each configuration is a flag set with a
`sampling` override (orchestrator/matrix/models.py), so one run holds them all:
  false alarms   hf at the smoke settings (temperature 0.8, top-p 0.95) against hf with the same settings
                 on other seeds (seed_offset 1000 k, k = 1 .. --offsets): every verdict that says
                 'different' is a false alarm; the share must stay at most sampling_alpha (0.01)
  power          llama.cpp q4_0 and llama.cpp with its default f16 KV cache, each against llama.cpp fp32
                 with an f32 KV cache, at --seeds seeds and at seeds: auto (until the test could see
                 sampling_shift, 0.05 nats/token, with 80% power; at most auto_seeds.max_seeds)
  engines        llama.cpp fp32 f32-KV against hf: llama.cpp applies top-p before temperature, so its
                 served samples may differ while the model does not; the verdict must not call it a model
                 difference, and must name the sampler difference
Every sample is scored by each comparison's baseline engine (hf's after the run, llama.cpp fp32 f32-KV's by
`rescore_run`), so both sides are judged under one model. It prints one table per part and writes each
verdict table as CSV under --out.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.execution.runner import rescore_run, run_matrix  # noqa: E402
from orchestrator.judge.sampling_verdicts import analyse_sampling  # noqa: E402

EXACT_KV = {"type_k": "f32", "type_v": "f32", "flash_attn": "off"}
SHOW = ["framework", "quantization", "flags", "samples_n", "dist_seeds_cell", "dist_seeds_base", "dist_scored_by",
        "dist_shift", "dist_shift_own", "dist_p", "dist_level", "dist_detectable", "model_test", "model_p", "first_p",
        "model_verdict", "served_verdict", "sampling_verdict", "seeds_needed"]


def matrix(offsets: int, seeds: int, max_seeds: int = 256) -> dict:
    auto = {"seeds": "auto", "auto_seeds": {"min_seeds": seeds, "step": 16, "max_seeds": max_seeds}}
    hf_sets = {f"off{k}": {"num_threads": 1, "sampling": {"seed_offset": 1000 * k}} for k in range(1, offsets + 1)}
    lc_sets = {"f32_kv": EXACT_KV, "f32_kv_auto": EXACT_KV | {"sampling": auto}, "default_auto": {"sampling": auto}}
    include = [{"framework": "hf", "flags": f, "quantization": "fp32"} for f in hf_sets]
    include += [{"framework": "llamacpp", "flags": f, "quantization": q} for q in ("fp32", "q4_0")
                for f in ("default", "f32_kv", "default_auto", "f32_kv_auto")]
    return {
        "name": "sampling-verdicts",
        "models": {"tiny": "builtin:tiny"},
        "axes": {"framework": ["hf"], "model": ["tiny"], "quantization": ["fp32"], "batch_size": [1],
                 "flags": ["default"], "input_len": [16], "output_len": [4]},
        "flags": {"hf": hf_sets | {"default": {"num_threads": 1}}, "llamacpp": lc_sets},
        "include": [r | {"batch_size": 1} for r in include],
        "measure": {"warmup": 0, "repeats": 1, "scoring_prompts": 8, "scoring_len": 32, "greedy_tokens": 4,
                    "score_repeats": 1,
                    "sampling": {"temperature": 0.8, "top_p": 0.95, "seeds": seeds, "tokens": 16, "repeats": 1}},
        "baseline": {"framework": "hf", "quantization": "fp32", "flags": "default"},
        "run": {"cell_timeout_s": 1800},
    }


def show(title: str, df) -> None:
    print(f"\n## {title}\n")
    print(df[[c for c in SHOW if c in df]].to_string(index=False, float_format=lambda x: f"{x:.3g}"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--offsets", type=int, default=20, help="identical-engine comparisons on other seeds")
    ap.add_argument("--seeds", type=int, default=16, help="seeds per prompt (the first draw of seeds: auto)")
    ap.add_argument("--out", type=Path, default=None, help="where the run and the CSV tables go")
    ap.add_argument("--reuse", action="store_true", help="judge the run already under --out again, without running")
    ap.add_argument("--quick", action="store_true", help="one offset, 4 seeds, seeds: auto up to 8, for CI")
    a = ap.parse_args()
    max_seeds = 256
    if a.quick:
        a.offsets, a.seeds, max_seeds = 1, 4, 8
    out = a.out or Path(tempfile.mkdtemp(prefix="sampling-verdicts-"))
    out.mkdir(parents=True, exist_ok=True)
    path = out / "matrix.yaml"
    if not a.reuse:
        path.write_text(yaml.safe_dump(matrix(a.offsets, a.seeds, max_seeds)))
    t0 = time.perf_counter()
    root = out / "run" if a.reuse else run_matrix(path, out / "run").root
    print(f"bench run: {time.perf_counter() - t0:.0f} s, run dir {root}")

    alarms = analyse_sampling(root)
    alarms = alarms[(alarms.framework == "hf") & (alarms["flags"] != "default")]
    show(f"false alarms: hf against hf on other seeds ({len(alarms)} comparisons)", alarms)
    n_diff = int((alarms.sampling_verdict == "different").sum())
    print(f"\nverdict 'different': {n_diff} of {len(alarms)} ({n_diff / max(len(alarms), 1):.1%}); at most "
          f"sampling_alpha 1% is the goal")
    alarms.to_csv(out / "false_alarms.csv", index=False)

    for tag, ref in (("at fixed seeds", "f32_kv"), ("at seeds: auto", "f32_kv_auto")):
        selector = {"framework": "llamacpp", "quantization": "fp32", "flags": ref}
        if not a.reuse:   # the run rescored everything with hf's engine (its matrix's baseline): this one's too
            t0 = time.perf_counter()
            rescore_run(root, selector)
            print(f"rescored by llama.cpp fp32 {ref}: {time.perf_counter() - t0:.0f} s")
        power = analyse_sampling(root, baseline=selector)
        want = ("default", "f32_kv") if ref == "f32_kv" else ("default_auto", "f32_kv_auto")
        power = power[(power.framework == "llamacpp") & power["flags"].isin(want)
                      & ~((power.quantization == "fp32") & (power["flags"] == ref))]
        show(f"power {tag}: llama.cpp q4_0 and f16 KV against fp32 f32-KV", power)
        power.to_csv(out / f"power_{ref}.csv", index=False)

    engines = analyse_sampling(root)
    engines = engines[(engines.framework == "llamacpp") & (engines.quantization == "fp32") & (engines["flags"] == "f32_kv")]
    show("engines: llama.cpp fp32 f32-KV against hf", engines)
    for r in engines.itertuples():
        print(f"\nmodel verdict: {r.model_verdict}; sampler note: {r.sampler_note}\nreason: {r.sampling_reason}")
    engines.to_csv(out / "engines.csv", index=False)


if __name__ == "__main__":
    main()
