"""The transformers CUDA path on a bare GPU box: the hf adapter's worker run directly (no Ray, no vLLM,
TensorRT-LLM or LMDeploy), on the built-in tiny model, in fp32 and bf16 on CUDA and in fp32 on the CPU.

Checks, and exits 1 on any failure (0 when every check passed; 2 when it cannot start):
- every cell is done, through the real worker (`python -m adapters.worker`) and its typed contract;
- GPU memory came from NVML (`nvml-tree`, or `nvml-device-delta` where a container hides the PIDs),
  above zero; nothing unmeasured is a number (`missing` names every null);
- timings are synchronised: per request TTFT > 0 and TTFT <= e2e, ITL gaps all positive;
- CUDA fp32 logprobs equal the CPU's within FP32_MAX_ABS with the same greedy tokens, and bf16 stays
  within BF16_MAX_ABS of them;
- the rescoring child (a spec with `rescore` and no cells: the baseline's engine scoring other cells' samples,
  teacher forced) writes every sample's scores, and CUDA fp32's equal the CPU's within FP32_MAX_ABS.

`--cpu-only` runs the same checks with the CPU alone (fp32 twice), so the script itself is tested
where there is no GPU (tests/engines/test_device_check.py). Run it through tests/gpu/device_check.sh.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from adapters.contract.events import CellDone, Loaded, parse_event
from adapters.contract.records import CellRecord
from adapters.contract.specs import (
    RESCORED_NPZ,
    CellSpec,
    GroupSpec,
    LoadSpec,
    ModelSpec,
    RescoredSample,
    RescoreSpec,
    ScoringSpec,
)

FP32_MAX_ABS = 5e-3      # CUDA vs CPU kernels: reduction order only
BF16_MAX_ABS = 0.5       # bf16 against fp32 on the tiny model
BF16_TOP1 = 0.9


def _prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return rng.integers(3, vocab, (n, length)).tolist()


def _spec(model: str, device: str, quant: str, vocab: int) -> GroupSpec:
    cells = [CellSpec(cell_id=f"b{b}", batch_size=b, output_len=16, warmup=1, repeats=3,
                      timing_prompts=_prompts(4 * b, 32, vocab, b)) for b in (1, 4)]
    return GroupSpec(load=LoadSpec(framework="hf", model=ModelSpec(name="tiny", source=model), quantization=quant,
                                   device=device), cells=cells,
                     scoring=ScoringSpec(prompts=_prompts(4, 48, vocab, 99), top_k=8, greedy_tokens=12, repeats=1))


def run_worker(spec: GroupSpec, work: Path) -> tuple[Loaded | None, dict[str, CellRecord], dict[str, dict]]:
    work.mkdir(parents=True, exist_ok=True)
    (work / "spec.json").write_text(spec.model_dump_json())
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "adapters.worker", str(work / "spec.json"), str(work)],
                          cwd=work, env=env, capture_output=True, text=True, timeout=1200)
    loaded, records, logprobs = None, {}, {}
    for line in (work / "events.jsonl").read_text().splitlines():
        ev = parse_event(line)
        if isinstance(ev, Loaded):
            loaded = ev
        elif isinstance(ev, CellDone):
            records[ev.cell_id] = CellRecord.model_validate_json((work / f"{ev.cell_id}.json").read_text())
            logprobs[ev.cell_id] = dict(np.load(work / f"{ev.cell_id}.npz"))
        elif hasattr(ev, "reason"):
            print(f"  worker event {ev.event}: {ev.reason}")
    if proc.returncode != 0:
        print(f"  worker exited {proc.returncode}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return loaded, records, logprobs


class Checks:
    def __init__(self) -> None:
        self.failed: list[str] = []

    def __call__(self, ok: bool, what: str) -> None:
        print(f"  {'ok  ' if ok else 'FAIL'} {what}")
        if not ok:
            self.failed.append(what)


def check_run(check: Checks, name: str, device: str, loaded, records: dict[str, CellRecord]) -> None:
    print(f"{name}:")
    check(loaded is not None and len(records) == 2, f"{name}: loaded and both cells done ({sorted(records)})")
    if loaded is None:
        return
    want = ("nvml-tree", "nvml-device-delta") if device == "cuda" else ("rss-peak-tree", "rss-tree")
    check(loaded.mem_source in want, f"{name}: memory source {loaded.mem_source} in {want}")
    for cid, r in records.items():
        check(r.peak_mem_bytes is not None and r.peak_mem_bytes > 0, f"{name} {cid}: peak memory {r.peak_mem_bytes}")
        check(all(0 < t <= e for t, e in zip(r.ttft_ms, r.e2e_ms)) and len(r.ttft_ms) == r.requests > 0,
              f"{name} {cid}: 0 < TTFT <= e2e for all {r.requests} requests (TTFT p50 {r.ttft_ms_p50:.2f} ms)")
        check(r.itl_ms_p50 is not None and r.itl_ms_p50 > 0 and r.itl_samples == r.requests * 15,
              f"{name} {cid}: ITL over {r.itl_samples} chunk gaps, p50 {r.itl_ms_p50:.3f} ms")
        # not figures: the SLO settings, and a search's fields (a plain cell is no search)
        nulls = {k for k, v in r.model_dump().items() if v is None and not k.startswith(("slo_", "search_"))}
        # the energy counters' name is null with the energy, whose reason is under energy_j
        named = {k.removesuffix("_ms") for k in r.missing} | ({"energy_source"} if "energy_j" in r.missing else set())
        unnamed = {k for k in nulls if not any(k.startswith(n) for n in named)}
        check(not unnamed, f"{name} {cid}: every null named in missing (unnamed: {sorted(unnamed)})")
        if device == "cuda":   # NVML's energy counter: joules, or why not (a tiny model's runs can be shorter
            # than the counter's update interval); never NVML missing or unsupported on a current GPU
            why = r.missing.get("energy_j", "")
            check((r.energy_j or 0) > 0 and (r.energy_source or "").startswith("nvml:") or "did not advance" in why,
                  f"{name} {cid}: NVML energy {r.energy_j} J ({r.energy_source}), "
                  f"{r.energy_j_per_token} J/token{f' [{why}]' if why else ''}")
        print(f"    {cid}: {r.output_tok_s:.1f} out tok/s, TPOT p50 {r.tpot_ms_p50:.3f} ms, "
              f"peak {r.peak_mem_bytes / 2**20:.1f} MiB")


def compare(check: Checks, name: str, a: dict, b: dict, max_abs: float, top1: float) -> None:
    for cid in sorted(set(a) & set(b)):
        x, y = a[cid], b[cid]
        if x["token_id"].shape != y["token_id"].shape:
            check(False, f"{name} {cid}: row counts differ {x['token_id'].shape} vs {y['token_id'].shape}")
            continue
        prompt = x["kind"] == 0
        diff = float(np.max(np.abs(x["logprob"][prompt] - y["logprob"][prompt])))
        agree = float(np.mean(x["topk_ids"][prompt, 0] == y["topk_ids"][prompt, 0]))
        gen = x["kind"] == 1
        same_greedy = bool((x["token_id"][gen] == y["token_id"][gen]).all())
        check(diff <= max_abs and agree >= top1, f"{name} {cid}: max |dlogprob| {diff:.2e} <= {max_abs:g}, "
              f"top-1 agreement {agree:.3f} >= {top1}")
        if top1 == 1.0:
            check(same_greedy, f"{name} {cid}: greedy tokens identical")


def rescored(model: str, device: str, vocab: int, work: Path) -> dict[str, np.ndarray] | None:
    """The rescoring child on `device`: 8 made-up samples of 16 tokens after 4 prompts, top 8 candidates."""
    rng = np.random.default_rng(5)
    spec = GroupSpec(load=LoadSpec(framework="hf", model=ModelSpec(name="tiny", source=model), quantization="fp32",
                                   device=device), cells=[],
                     rescore=RescoreSpec(prompts=_prompts(4, 32, vocab, 7), top_k=8, batch_size=4, samples=[
                         RescoredSample(prompt_index=i % 4, tokens=rng.integers(3, vocab, 16).tolist())
                         for i in range(8)]))
    run_worker(spec, work)
    path = work / RESCORED_NPZ
    return dict(np.load(path)) if path.exists() else None


def check_rescoring(check: Checks, model: str, vocab: int, work: Path, gpu: str) -> None:
    print("rescoring:")
    runs = {"cpu": "cpu", gpu if gpu != "cpu" else "cpu-again": gpu}
    got = {name: rescored(model, d, vocab, work / f"rescore-{name}") for name, d in runs.items()}
    for name, a in got.items():
        check(a is not None and a["logprobs"].shape == (8, 16) and a["topk_ids"].shape == (8, 16, 8)
              and bool(np.isfinite(a["logprobs"]).all()), f"rescore on {name}: every sample's 16 tokens scored, top 8 each")
    (a, b), other = got.values(), list(got)[1]
    if a is not None and b is not None:
        diff = float(np.max(np.abs(b["logprobs"] - a["logprobs"])))
        check(diff <= FP32_MAX_ABS, f"rescore {other} vs cpu: max |dlogprob| {diff:.2e} <= {FP32_MAX_ABS:g}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu-only", action="store_true", help="no GPU: check the script itself on the CPU")
    ap.add_argument("--work", default=None, help="where the workers write (default: a temp dir)")
    args = ap.parse_args()
    try:
        import torch

        from orchestrator.inputs.tiny_model import resolve_builtin
    except ImportError as err:
        print(f"cannot start: {err}")
        return 2
    if not args.cpu_only and not torch.cuda.is_available():
        print("cannot start: torch sees no CUDA GPU (use --cpu-only to check the script on a CPU)")
        return 2
    model = str(resolve_builtin("tiny", Path(os.environ.get("LOSSLESS_BENCH_CACHE", ROOT / ".cache"))))
    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    work = Path(args.work or tempfile.mkdtemp(prefix="device-check-"))
    gpu = "cpu" if args.cpu_only else "cuda"
    check = Checks()
    runs = {}
    for name, device, quant in (("cpu-fp32", "cpu", "fp32"), (f"{gpu}-fp32", gpu, "fp32"), (f"{gpu}-bf16", gpu, "bf16")):
        if name in runs:
            name += "-again"
        loaded, records, lps = run_worker(_spec(model, device, quant, vocab), work / name)
        check_run(check, name, device, loaded, records)
        runs[name] = lps
    names = list(runs)
    print("logprobs:")
    compare(check, f"{names[1]} vs {names[0]}", runs[names[1]], runs[names[0]], FP32_MAX_ABS, 1.0)
    compare(check, f"{names[2]} vs {names[0]}", runs[names[2]], runs[names[0]], BF16_MAX_ABS, BF16_TOP1)
    check_rescoring(check, model, vocab, work, gpu)
    print(f"\n{'FAILED: ' + str(len(check.failed)) + ' check(s)' if check.failed else 'all checks passed'}")
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
