"""What the harness costs in the numbers it reports: `bench run` against a bare loop of the same engine.

For each engine (hf, llamacpp, vllm) on the built-in tiny model, and each batch size, one script run
alternates rounds of

  bench: a real `bench run` of a one-engine matrix (Ray, the child interpreter, the adapter, the
         trackers: everything), read back from the stored cells table: the samples behind
         `output_tok_s` (`output_tok_s_runs`, one per timed batch) and `ttft_ms_p50` (`ttft_ms`, one
         per request);
  bare:  a fresh interpreter (the engine's own: .venvs/vllm for vLLM) that loads the same engine
         and runs the same timed batches of the same token ids with the engine's plainest API, with
         nothing else running: no Ray, no tracker, no adapter;

and prints, per side, the median of all its samples over the rounds, the ratio bench/bare of those
medians, and the range of the per-round ratios (each round's medians) as the spread. Medians, not
bench's stored mean: on a shared machine one batch that another job preempted moves a mean by
percent. The two sides run one after the other (never at once), in alternating order, each after
waiting (up to --wait-idle seconds) for the machine to be idle, so machine noise and drift hit both.
The token ids are built as `bench` builds them (orchestrator.execution.engine_child.prompts.timing_prompts with the
matrix's workload, n = (warmup + repeats) x batch size, input_len), and both sides run `warmup`
untimed batches, then `repeats` timed batches, of exactly those prompts, in the same order.

How each side times (perf_counter):
  throughput, both sides: output tokens of a batch / wall time of the call that generated it (one
      sample per timed batch, as bench's output_tok_s_runs);
  TTFT, bench: the adapter's own (hf: a StoppingCriteria stamp once the first step's tokens are chosen;
      llama.cpp: after the argmax of the prefill's logits; vLLM: when the first step's output reaches the
      output processor in the calling process, the contract's definition: later than the engine core's
      stamp by the IPC hop, so vLLM's TTFT ratio includes that hop, not only bench's cost);
  TTFT, bare: hf: the wall time of a separate model.generate(max_new_tokens=1) on the same batch
      (no per-step hook in the timed throughput call); llama.cpp: after the argmax of the prefill's
      logits in its own decode loop (as bench); vLLM: metrics.first_token_ts - start (as bench; this
      needs disable_log_stats=False, which both sides therefore set).
  One TTFT sample per request (a static batch's requests share one).

Side by side in separate processes, the machine's own noise (bare vs bare: --control) is 10-30% on a
shared 2-core VM, ten times the goal. So each engine also gets a paired table: one interpreter loads
the engine through its adapter, and alternates, batch by batch (AB, BA, ...), the adapter's generate
(with the worker's memory tracker, as in a cell; tok/s and TTFT as bench computes them from the
adapter's stamps; `wall ratio`: tok/s from the wall time around the adapter's call instead) and the
bare call on the same engine object; the ratio is the median of the per-pair ratios. That isolates
what bench's own code adds on the engine's path, with the drift cancelled; what runs beside it
(Ray, the launcher's polling, the driver) is what the process-level rounds show.

Run it with the main venv's python (it starts the vLLM side in .venvs/vllm by itself):

    .venv/bin/python benchmarks/overhead.py                       # all three engines, batch 1 and 4
    .venv/bin/python benchmarks/overhead.py --engines hf --rounds 3
    .venv/bin/python benchmarks/overhead.py --json /tmp/overhead.json
    .venv/bin/python benchmarks/overhead.py --root /tmp/old-checkout   # bench from another checkout
    .venv/bin/python benchmarks/overhead.py --quick    # hf, batch 1, one round of 2 batches, no idle wait (CI)

`--bare ENGINE JOB OUT` is the child's entry point (not for people).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VLLM_KV_BYTES = 2**30  # the adapter's default CPU KV cache (adapters/engines/vllm/adapter.py _DEFAULT_CPU_KV_GIB)


# ---------------------------------------------------------------------------------------------------
# the bare loops: the engine's own API only (nothing from this project is imported here)

def _batches(job: dict, bs: int) -> tuple[list, list]:
    prompts = job["prompts"][str(bs)]
    batches = [prompts[i:i + bs] for i in range(0, len(prompts), bs)]
    return batches[: job["warmup"]], batches[job["warmup"]: job["warmup"] + job["repeats"]]


# Each bare engine: load it, then return run(batch) -> {"elapsed", "tokens", "ttft"} for one batch
# of token ids, greedy, EOS ignored, `output_len` new tokens per sequence.

def bare_hf(job: dict, model=None):
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    if model is None:
        model = AutoModelForCausalLM.from_pretrained(job["model"], dtype=torch.float32).eval()
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    greedy = GenerationConfig(do_sample=False, eos_token_id=None, pad_token_id=pad)
    # EOS ignored: generate fills a config's unset eos_token_id from the checkpoint's, so only the keyword
    # keeps it off (as the adapter passes it); without it this loop ran an EOS check and padding every step
    no_eos = dict(generation_config=greedy, eos_token_id=None)
    n_new = job["output_len"]

    def run(batch):
        with torch.inference_mode():
            ids = torch.tensor(batch, dtype=torch.long)
            mask = torch.ones_like(ids)
            t0 = time.perf_counter()
            seqs = model.generate(ids, attention_mask=mask, **no_eos, max_new_tokens=n_new)
            t1 = time.perf_counter()
            model.generate(ids, attention_mask=mask, **no_eos, max_new_tokens=1)
            t2 = time.perf_counter()
        return {"elapsed": t1 - t0, "tokens": int((seqs.shape[1] - ids.shape[1]) * len(batch)),
                "ttft": [t2 - t1] * len(batch)}
    return run


def bare_llamacpp(job: dict, model=None):
    """model: a loaded llama.cpp adapter whose model and context to run on (paired); None: load them here."""
    import llama_cpp as L
    import numpy as np

    adapter = model
    L.llama_backend_init()
    if adapter is None:
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        mp.use_extra_bufts = False   # as the adapter runs it (its default; llama.cpp's own is true)
        model = L.llama_model_load_from_file(job["model"].encode(), mp)
    else:
        model = adapter._model
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    threads = len(os.sched_getaffinity(0))
    n_new = job["output_len"]
    contexts = {}

    def context(bs):
        if bs not in contexts:
            if adapter is not None:   # the adapter's own context (it sized it for bs at its warm-up)
                ctx = adapter._ctx
            else:
                cp = L.llama_context_default_params()
                cp.n_ctx = 256 * bs      # as the adapter sizes it: 256 tokens per sequence here
                cp.n_seq_max = bs
                cp.n_threads = cp.n_threads_batch = threads
                ctx = L.llama_init_from_model(model, cp)
            contexts[bs] = (ctx, L.llama_get_memory(ctx), L.llama_batch_init(2048, 0, bs))
        return contexts[bs]

    def run(prompts):
        bs = len(prompts)
        ctx, mem, batch = context(bs)
        L.llama_memory_clear(mem, True)
        n = 0
        for s, p in enumerate(prompts):
            for i, tok in enumerate(p):
                batch.token[n], batch.pos[n], batch.n_seq_id[n] = tok, i, 1
                batch.seq_id[n][0], batch.logits[n] = s, i == len(p) - 1
                n += 1
        batch.n_tokens = n
        t0 = time.perf_counter()
        L.llama_decode(ctx, batch)   # the logits of the outputs (each prompt's last token), in order:
        toks = np.ctypeslib.as_array(L.llama_get_logits(ctx), (bs, n_vocab)).argmax(axis=1).tolist()
        t_first = time.perf_counter()
        produced = bs
        for step in range(1, n_new):
            for s in range(bs):
                batch.token[s], batch.pos[s], batch.n_seq_id[s] = toks[s], len(prompts[s]) + step - 1, 1
                batch.seq_id[s][0], batch.logits[s] = s, 1
            batch.n_tokens = bs
            L.llama_decode(ctx, batch)
            toks = np.ctypeslib.as_array(L.llama_get_logits(ctx), (bs, n_vocab)).argmax(axis=1).tolist()
            produced += bs
        return {"elapsed": time.perf_counter() - t0, "tokens": produced, "ttft": [t_first - t0] * bs}
    return run


def bare_vllm(job: dict, model=None):
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    # disable_log_stats=False: RequestOutput.metrics (the TTFT source, as in bench) is filled only then
    llm = model or LLM(model=job["model"], dtype="float32", seed=0, kv_cache_memory_bytes=VLLM_KV_BYTES,
                       disable_log_stats=False)
    params = SamplingParams(temperature=0.0, max_tokens=job["output_len"], ignore_eos=True, detokenize=False)

    def run(batch):
        prompts = [TokensPrompt(prompt_token_ids=p) for p in batch]
        llm.reset_prefix_cache()   # as bench: no timed batch reuses KV of an earlier one
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        t1 = time.perf_counter()
        return {"elapsed": t1 - t0, "tokens": sum(len(o.outputs[0].token_ids) for o in outs),
                "ttft": [o.metrics.first_token_ts - t0 for o in outs]}
    return run


BARE = {"hf": bare_hf, "llamacpp": bare_llamacpp, "vllm": bare_vllm}


def bare_loop(engine: str, job: dict) -> dict:
    """The bare side of a round: a fresh interpreter with the engine only, every batch size's batches."""
    run = BARE[engine](job)
    out = {}
    for bs in job["batch_sizes"]:
        warm, timed = _batches(job, bs)
        for batch in warm:
            run(batch)
        out[str(bs)] = [run(batch) for batch in timed]
    return out


def paired_loop(engine: str, job: dict) -> dict:
    """One interpreter, one engine: the adapter's generate (with the worker's memory tracker, as in a
    cell) and the bare call, alternating batch by batch (AB, BA, ...), so the
    machine's drift hits both alike. What bench's own code adds on the engine's path, nothing else."""
    sys.path.insert(0, str(ROOT))
    from adapters import ADAPTERS
    from adapters.contract.specs import LoadSpec, ModelSpec
    from adapters.meters.memory import MemoryTracker

    adapter = ADAPTERS[engine]()
    adapter.load(LoadSpec(framework=engine, model=ModelSpec(name="tiny", source=job["source"]), quantization="fp32",
                          options={}, device="cpu",
                          cache_dir=job["cache_dir"], context_len=job["context_len"]))
    # the bare call on the adapter's own engine (model, context, LLM): a second engine in the process
    # would compete with the first (llama.cpp's idle thread pools spin), and the pairing would measure that
    run = BARE[engine](job, {"hf": getattr(adapter, "model", None), "vllm": getattr(adapter, "llm", None),
                             "llamacpp": adapter}[engine])

    tracker = MemoryTracker("cpu").start()

    def via_adapter(batch):   # as run_cell times a batch: the tracker reset before, read after
        tracker.reset_peak()
        t0 = time.perf_counter()
        t = adapter.generate(batch, job["output_len"], True)
        wall = time.perf_counter() - t0
        tracker.peak()
        return {"elapsed": t.end - t.start, "tokens": sum(r.output_tokens for r in t.requests), "wall": wall,
                "ttft": [r.chunk_times[0] - r.sent for r in t.requests]}

    out = {}
    for bs in job["batch_sizes"]:
        warm, timed = _batches(job, bs)
        for batch in warm:
            via_adapter(batch), run(batch)
        sides = {"bench": [], "bare": []}
        for i, batch in enumerate(timed):
            for side in (("bench", "bare") if i % 2 == 0 else ("bare", "bench")):
                sides[side].append(via_adapter(batch) if side == "bench" else run(batch))
        out[str(bs)] = sides
    tracker.stop()
    adapter.close()
    return out



# ---------------------------------------------------------------------------------------------------
# the driver (main venv)

def _matrix(engine: str, args) -> dict:
    return {
        "name": f"overhead-{engine}", "models": {"tiny": "builtin:tiny"},
        "axes": {"framework": [engine], "model": ["tiny"], "quantization": ["fp32"],
                 "batch_size": args.batch_sizes, "input_len": [args.input_len], "output_len": [args.output_len]},
        "workload": {"kind": "synthetic", "seed": args.seed, "shared_prefix_len": 0},
        # the logprob capture runs after the timed batches; kept small, it does not touch them
        "measure": {"warmup": args.warmup, "repeats": args.repeats, "scoring_prompts": 1, "scoring_len": 16,
                    "greedy_tokens": 2, "score_repeats": 1, "top_k": 4},
        "run": {"cell_timeout_s": 900},
    }


def _bare_job(engine: str, matrix_path: Path, cache: Path, repeats: int | None = None) -> dict:
    """The engine's model file and each batch size's prompts, built as bench builds them."""
    from orchestrator.execution.engine_child.prompts import Tokenizer, timing_prompts
    from orchestrator.execution.engine_child.spec import resolve_source
    from orchestrator.matrix.validate import load_matrix

    m, _ = load_matrix(matrix_path)
    source = resolve_source(m.model_entry("tiny").source, str(cache))
    tok = Tokenizer(source)
    w, r = m.measure.warmup, repeats or m.measure.repeats
    input_len, output_len = m.axes.input_len[0], m.axes.output_len[0]
    prompts = {str(bs): timing_prompts(m.workload, tok, w * bs + r * bs, input_len) for bs in m.axes.batch_size}
    model = source
    if engine == "llamacpp":   # the GGUF the adapter converted (cached under the same cache dir)
        from adapters.engines.llamacpp import gguf_convert

        model = str(gguf_convert.gguf_for(source, "fp32", str(cache / "engines"))[0])
    return {"model": model, "prompts": prompts, "batch_sizes": list(m.axes.batch_size), "warmup": w,
            "repeats": r, "output_len": output_len, "source": source, "cache_dir": str(cache / "engines"),
            "context_len": input_len + output_len}


def _python(engine: str) -> str:
    venv = ROOT / ".venvs" / engine / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def _samples(runs: list[dict]) -> dict:
    """Per timed batch output tok/s and per request TTFT ms, as bench computes them (adapters/meters/memory.py)."""
    return {"tok_s": [r["tokens"] / r["elapsed"] for r in runs], "ttft_ms": [t * 1e3 for r in runs for t in r["ttft"]]}


def run_bench(engine: str, matrix_path: Path, work: Path, env: dict, root: Path = ROOT) -> dict:
    run_dir = work / f"run-{time.monotonic_ns()}"
    cmd = [sys.executable, "-m", "orchestrator.cli", "run", str(matrix_path), "--run-dir", str(run_dir)]
    env = env | {"PYTHONPATH": os.pathsep.join([str(root), env.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"bench run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    from orchestrator.store.run_store import RunStore

    cells = RunStore(run_dir).read_cells()
    out = {}
    for _, row in cells.iterrows():
        if row["status"] != "ok":
            raise RuntimeError(f"{engine} batch {row['batch_size']}: {row['status']}: {row['reason']}")
        # the samples behind bench's output_tok_s (their mean) and ttft_ms_p50 (their median)
        out[str(int(row["batch_size"]))] = {"tok_s": [float(x) for x in row["output_tok_s_runs"]],
                                            "ttft_ms": [float(x) for x in row["ttft_ms"]]}
    return out


def _child(flag: str, engine: str, job_path: Path, work: Path, env: dict) -> dict:
    result = work / f"{flag}-{time.monotonic_ns()}.json"
    cmd = [_python(engine), str(Path(__file__).resolve()), f"--{flag}", engine, str(job_path), str(result)]
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{flag} {engine} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(result.read_text())


def run_bare(engine: str, job_path: Path, work: Path, env: dict) -> dict:
    return {k: _samples(v) for k, v in _child("bare", engine, job_path, work, env).items()}


def run_paired(engine: str, job_path: Path, work: Path, env: dict) -> dict:
    return {bs: {side: _samples(runs) | {"wall_tok_s": [r["tokens"] / r["wall"] for r in runs if "wall" in r]}
                 for side, runs in sides.items()}
            for bs, sides in _child("paired", engine, job_path, work, env).items()}


def _goal(tok_s_ratio: float, ttft_bench_ms: float, ttft_bare_ms: float) -> str:
    """The issue's goals: throughput ratio >= 0.98, TTFT within 2% or 1 ms."""
    ok_tp = tok_s_ratio >= 0.98
    ok_tt = abs(ttft_bench_ms / ttft_bare_ms - 1) <= 0.02 or abs(ttft_bench_ms - ttft_bare_ms) <= 1.0
    return "met" if ok_tp and ok_tt else "missed: " + ", ".join(
        n for n, ok in (("throughput", ok_tp), ("TTFT", ok_tt)) if not ok)


def paired_lines(paired: dict, batch_sizes: list[int]) -> list[str]:
    """Per engine and batch: medians of each side, and the median (and quartiles) of the per-pair ratios."""
    import numpy as np

    lines = [(f"{'engine':9} {'batch':>5} {'pairs':>5}  {'bench tok/s':>11} {'bare tok/s':>10} {'ratio':>6} "
              f"{'[q1-q3]':>13} {'wall ratio':>10}  {'bench TTFT':>10} {'bare TTFT':>9} {'ratio':>6} {'diff ms':>7}  goal"),
             "-" * 126]
    for engine, by_bs in paired.items():
        for bs in batch_sizes:
            a, b = by_bs[str(bs)]["bench"], by_bs[str(bs)]["bare"]
            pair = np.asarray(a["tok_s"]) / np.asarray(b["tok_s"])
            wall = float(np.median(np.asarray(a["wall_tok_s"]) / np.asarray(b["tok_s"])))
            tp_a, tp_b = float(np.median(a["tok_s"])), float(np.median(b["tok_s"]))
            tt_a, tt_b = float(np.median(a["ttft_ms"])), float(np.median(b["ttft_ms"]))
            ratio = float(np.median(pair))
            goal = _goal(ratio, tt_a, tt_b)
            q1, q3 = np.percentile(pair, [25, 75])
            lines.append(f"{engine:9} {bs:>5} {len(pair):>5}  {tp_a:>11.1f} {tp_b:>10.1f} {ratio:>6.3f} "
                         f"{f'[{q1:.3f}-{q3:.3f}]':>13} {wall:>10.3f}  {tt_a:>8.2f}ms {tt_b:>7.2f}ms "
                         f"{tt_a / tt_b:>6.3f} {tt_a - tt_b:>+7.2f}  {goal}")
    return lines


def _busy(window_s: float = 2.0) -> float:
    """CPUs busy (in units of one CPU) over the next window_s, from /proc/stat: other people's jobs."""
    def snap():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]   # total, idle + iowait
    t0, i0 = snap()
    time.sleep(window_s)
    t1, i1 = snap()
    return (os.cpu_count() or 1) * (1 - (i1 - i0) / max(t1 - t0, 1))


def wait_idle(timeout_s: float, busy_below: float = 0.2) -> float:
    """Wait until the machine is idle (less than busy_below CPUs busy over 2 s), at most timeout_s; the last busy."""
    deadline = time.monotonic() + timeout_s
    while True:
        busy = _busy()
        if busy < busy_below or time.monotonic() > deadline:
            return busy


def _ratio_cell(rounds: list[dict], bs: str, key: str, a: str = "bench", b: str = "bare"):
    """Medians of each side's samples over all rounds, their ratio a/b, and the range of the per-round ratios."""
    import numpy as np

    med = lambda side, rs: float(np.median([x for g in rs for x in g[side][bs][key]]))
    per_round = [med(a, [g]) / med(b, [g]) for g in rounds]
    mb, mr = med(a, rounds), med(b, rounds)
    return mb, mr, mb / mr, min(per_round), max(per_round)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", default="hf,llamacpp,vllm")
    p.add_argument("--batch-sizes", default="1,4")
    p.add_argument("--rounds", type=int, default=4, help="bench/bare pairs per engine (alternating order)")
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--wait-idle", type=float, default=120, metavar="S",
                   help="before each side, wait up to S seconds for the machine to be idle (under 0.2 CPUs busy "
                        "over 2 s: other people's jobs); 0: do not wait")
    p.add_argument("--control", action="store_true", help="run the bare side twice a round and print bare vs "
                   "bare too: the noise floor of the ratios on this machine")
    p.add_argument("--json", help="write every round's numbers here")
    p.add_argument("--root", type=Path, default=ROOT, help="the checkout whose `bench` runs (default: this one; "
                   "e.g. a copy without a fix, for before/after)")
    p.add_argument("--paired-repeats", type=int, default=60, metavar="N",
                   help="timed batches per side and batch size in the paired table (0: no paired table)")
    p.add_argument("--bare", nargs=3, metavar=("ENGINE", "JOB", "OUT"), help=argparse.SUPPRESS)
    p.add_argument("--paired", nargs=3, metavar=("ENGINE", "JOB", "OUT"), help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="hf, batch 1, one round of 2 timed batches (8 tokens), "
                   "2 paired batches, no idle wait, for CI")
    args = p.parse_args(argv)
    if args.quick:
        args.engines, args.batch_sizes, args.rounds, args.output_len = "hf", "1", 1, 8
        args.warmup, args.repeats, args.paired_repeats, args.wait_idle = 1, 2, 2, 0
    for flag, loop in (("bare", bare_loop), ("paired", paired_loop)):
        if getattr(args, flag):
            engine, job, out = getattr(args, flag)
            Path(out).write_text(json.dumps(loop(engine, json.loads(Path(job).read_text()))))
            return 0

    import yaml

    sys.path.insert(0, str(ROOT))
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    engines = args.engines.split(",")
    cache = Path(os.environ.get("LOSSLESS_BENCH_CACHE", Path.home() / ".cache" / "lossless-bench"))
    env = os.environ | {"LOSSLESS_BENCH_CACHE": str(cache),
                        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    rounds: dict = {}
    paired: dict = {}
    for engine in engines:
        matrix_path = work / f"{engine}.yaml"
        matrix_path.write_text(yaml.safe_dump(_matrix(engine, args)))
        job_path = work / f"{engine}-job.json"
        if engine == "llamacpp":   # the GGUF conversion happens in the first bench run: do one first
            run_bench(engine, matrix_path, work, env, args.root)
        job_path.write_text(json.dumps(_bare_job(engine, matrix_path, cache)))
        rounds[engine] = []
        for r in range(args.rounds):
            sides = ("bench", "bare") if r % 2 == 0 else ("bare", "bench")
            if args.control:   # a second bare run: what the ratio shows when nothing differs
                sides = sides + ("bare2",) if r % 2 == 0 else ("bare2",) + sides
            got = {}
            for side in sides:
                busy = wait_idle(args.wait_idle) if args.wait_idle else None
                t = time.monotonic()
                got[side] = (run_bench(engine, matrix_path, work, env, args.root) if side == "bench"
                             else run_bare(engine, job_path, work, env))   # bare and bare2
                import numpy as np

                brief = {k: [round(float(np.median(v["tok_s"])), 1), round(float(np.median(v["ttft_ms"])), 3)]
                         for k, v in got[side].items()}
                print(f"{engine} round {r + 1}/{args.rounds} {side}: {time.monotonic() - t:.0f} s, "
                      f"median tok/s and TTFT ms {brief}, load {os.getloadavg()[0]:.2f}, CPUs busy before "
                      f"{busy if busy is None else round(busy, 2)}", file=sys.stderr, flush=True)
            rounds[engine].append(got)
        if args.paired_repeats:
            paired_job = work / f"{engine}-paired-job.json"
            paired_job.write_text(json.dumps(_bare_job(engine, matrix_path, cache, args.paired_repeats)))
            busy = wait_idle(args.wait_idle) if args.wait_idle else None
            t = time.monotonic()
            paired[engine] = run_paired(engine, paired_job, work, env)
            print(f"{engine} paired: {time.monotonic() - t:.0f} s, load {os.getloadavg()[0]:.2f}, CPUs busy before "
                  f"{busy if busy is None else round(busy, 2)}", file=sys.stderr, flush=True)
    load_after = os.getloadavg()

    lines = [(f"overhead: bench run vs a bare loop, builtin:tiny fp32, input {args.input_len}, output "
              f"{args.output_len} tokens, warmup {args.warmup}, {args.repeats} timed batches, {args.rounds} rounds, "
              f"bench from {args.root}; load avg {load_before[0]:.2f} -> {load_after[0]:.2f}"),
             "",
             (f"{'engine':9} {'batch':>5}  {'bench tok/s':>11} {'bare tok/s':>10} {'ratio':>6} {'[min-max]':>13}  "
              f"{'bench TTFT':>10} {'bare TTFT':>9} {'ratio':>6} {'[min-max]':>13} {'diff ms':>7}  goal"),
             "-" * 124]
    for engine in engines if args.rounds else []:
        for bs in args.batch_sizes:
            k = str(bs)
            tp = _ratio_cell(rounds[engine], k, "tok_s")
            tt = _ratio_cell(rounds[engine], k, "ttft_ms")
            goal = _goal(tp[2], tt[0], tt[1])
            lines.append(f"{engine:9} {bs:>5}  {tp[0]:>11.1f} {tp[1]:>10.1f} {tp[2]:>6.3f} "
                         f"{f'[{tp[3]:.3f}-{tp[4]:.3f}]':>13}  {tt[0]:>8.2f}ms {tt[1]:>7.2f}ms {tt[2]:>6.3f} "
                         f"{f'[{tt[3]:.3f}-{tt[4]:.3f}]':>13} {tt[0] - tt[1]:>+7.2f}  {goal}")
            if args.control:
                cp = _ratio_cell(rounds[engine], k, "tok_s", "bare2", "bare")
                ct = _ratio_cell(rounds[engine], k, "ttft_ms", "bare2", "bare")
                lines.append(f"{'  control':9} {bs:>5}  {cp[0]:>11.1f} {cp[1]:>10.1f} {cp[2]:>6.3f} "
                             f"{f'[{cp[3]:.3f}-{cp[4]:.3f}]':>13}  {ct[0]:>8.2f}ms {ct[1]:>7.2f}ms {ct[2]:>6.3f} "
                             f"{f'[{ct[3]:.3f}-{ct[4]:.3f}]':>13} {ct[0] - ct[1]:>+7.2f}  (bare vs bare)")
    if paired:
        lines += ["", (f"paired in one process: the adapter's generate (with the memory tracker) and the bare call on "
                       f"one engine, alternating batch by batch, {args.paired_repeats} timed batches each"), "",
                  *paired_lines(paired, args.batch_sizes)]
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "load": [load_before, load_after],
                                               "rounds": rounds, "paired": paired}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
