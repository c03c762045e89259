"""The analysis at scale: `bench compare`, `bench gate` and `bench report` over 100,000 cells.

    python benchmarks/analysis_at_scale.py                           # 100,000 cells, 20M logprob rows
    python benchmarks/analysis_at_scale.py --cells 10000 --rows 2000000   # a quick try
    python benchmarks/analysis_at_scale.py --per-cell                # also time the uncompacted layout
    python benchmarks/analysis_at_scale.py --storage-only            # only the bytes-per-token table
    python benchmarks/analysis_at_scale.py --dir D --keep --compact-only   # only `bench compact`, on a copy
    python benchmarks/analysis_at_scale.py --quick                   # 300 cells, 30,000 rows (CI)

It exits 1 when a command exits other than 0 or 1 (1: the gate's or compare's verdict, not a failure).

1. A synthetic run is written the way `bench run` writes one: the cells come from a real matrix
   (`orchestrator.matrix.cells.expand`: real cell ids and engine keys), 5 frameworks x 27 models x 4
   quantizations x 4 flag sets x 8 batch sizes x 6 lengths, sampled down to --cells with every
   baseline cell kept; each row starts as `orchestrator.execution.engine_child.rows.cell_row` and every cell is stored with
   `RunStore.write_cell` (one record per cell appended to the run's journal, as `bench run` stores
   it; a checkout before the journal wrote a cells and a logprobs file per cell), and the
   manifest with `manifest.write`. hf and llama.cpp do not run fp8 (`unsupported` rows) and 1.5%
   of the rest failed, crashed or timed out (no logprobs). Every ok cell has 4 scoring prompts,
   teacher forced over `scoring_len` positions (chosen so the run has about --rows rows) plus 8
   greedy tokens, top-k 20, repeats 0 and 1. The logprobs are a per-model "truth" moved by a
   per-config amount (fp32 hf: 0, so identical; fp16/bf16/fp8 and the engines: 1e-7..3e-2), so
   every verdict occurs, with run-to-run and batch noise for the noise floors. Values are
   vectorised numpy per cell; no Python loop per row.
2. `bench compact` folds the journal (or per-cell files) (what `bench run` does when it ends), timed
   as a process. With --compact-only it folds a hard-linked copy of the run (compaction only adds,
   renames and removes files, never writes into one), so a kept run can be compacted again with --reuse.
3. `bench compare`, `bench gate` and `bench report` run as separate processes; wall time, CPU time
   and the peak RSS of each process tree (sampled every 50 ms with psutil) are printed. Each runs
   this checkout's code (`python -m orchestrator.cli` from its root), whichever checkout the
   venv's `bench` entry point was installed from.
4. Storage: bytes on disk per captured token and per (token, candidate), on real logprobs of the
   built-in tiny model (`adapters.worker.group.capture_logprobs` through the hf adapter, measure defaults:
   8 prompts x 63 positions + 16 greedy tokens, 2 repeats, top-k 20), as a per-cell file and
   compacted, with the old writer settings (plain zstd) beside the current ones.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.execution.engine_child.rows import cell_row  # noqa: E402
from orchestrator.execution.engine_child.spec import GroupJob  # noqa: E402
from orchestrator.matrix.cells import expand, group  # noqa: E402
from orchestrator.matrix.validate import parse_matrix  # noqa: E402
from orchestrator.store import manifest  # noqa: E402
from orchestrator.store.journal import journal_files, scan  # noqa: E402
from orchestrator.store.run_store import RunStore  # noqa: E402
from orchestrator.store.schema import CELLS_SCHEMA, LOGPROBS_SCHEMA

TOP_K = 20
PROMPTS = 4
GREEDY = 8
FRAMEWORKS = ("hf", "vllm", "trtllm", "lmdeploy", "llamacpp")
QUANTS = ("fp32", "fp16", "bf16", "fp8")
FLAGS = {
    "hf": {"f1": {"attn_implementation": "eager"}, "f2": {"attn_implementation": "sdpa"}, "f3": {"static_cache": True}},
    "vllm": {"f1": {"enforce_eager": True}, "f2": {"enable_prefix_caching": False}, "f3": {"max_num_seqs": 64}},
    "trtllm": {"f1": {"cuda_graphs": False}, "f2": {"overlap_scheduler": False}, "f3": {"backend": "tensorrt"}},
    "lmdeploy": {"f1": {"backend": "pytorch"}, "f2": {"enable_prefix_caching": True}, "f3": {"quant_policy": 8}},
    "llamacpp": {"f1": {"flash_attn": "off"}, "f2": {"type_k": "f32", "type_v": "f32", "flash_attn": "off"},
                 "f3": {"n_batch": 512}},
}
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
LENGTHS = ((128, 64), (128, 256), (512, 64), (512, 256), (2048, 64), (2048, 256))
CELLS_PER_MODEL = len(FRAMEWORKS) * len(QUANTS) * 4 * len(BATCHES) * len(LENGTHS)
UNSUPPORTED = {("hf", "fp8"), ("llamacpp", "fp8")}
# how far a config's logprobs move from the truth (standard deviation, nats)
QUANT_SHIFT = {"fp32": 0.0, "fp16": 3e-4, "bf16": 2e-3, "fp8": 2e-2}
FW_SHIFT = {"hf": 0.0, "vllm": 1e-6, "trtllm": 2e-6, "lmdeploy": 5e-6, "llamacpp": 3e-3}
FW_SPEED = {"hf": 0.35, "vllm": 1.0, "trtllm": 1.15, "lmdeploy": 1.05, "llamacpp": 0.5}
QUANT_SPEED = {"fp32": 0.5, "fp16": 1.0, "bf16": 1.0, "fp8": 1.6}


def matrix_dict(n_models: int, scoring_len: int) -> dict:
    return {
        "name": "at-scale",
        "models": {f"m{i:02d}": f"synthetic/model-{i:02d}" for i in range(n_models)},   # hub ids: never loaded
        "axes": {"framework": list(FRAMEWORKS), "model": [f"m{i:02d}" for i in range(n_models)],
                 "quantization": list(QUANTS), "batch_size": list(BATCHES), "flags": ["default", "f1", "f2", "f3"],
                 "input_len": sorted({i for i, _ in LENGTHS}), "output_len": sorted({o for _, o in LENGTHS})},
        "flags": FLAGS,
        "measure": {"warmup": 1, "repeats": 3, "top_k": TOP_K, "scoring_prompts": PROMPTS, "scoring_len": scoring_len,
                    "greedy_tokens": GREEDY, "score_repeats": 2},
        "baseline": {"framework": "hf", "quantization": "fp32", "flags": "default"},
        "run": {"device": "cuda"},
    }


# ------------------------------------------------------------------ synthetic values

def truth_rows(n_models: int, scoring_len: int, rng) -> dict[str, np.ndarray]:
    """Per model: top-k ids and logprobs of every scored position (prompt rows, then greedy rows)."""
    n = PROMPTS * (scoring_len - 1 + GREEDY)
    vocab = 32000
    out = {}
    for m in range(n_models):
        ranks = rng.zipf(1.3, size=(n, TOP_K * 3)) % vocab
        ids = np.empty((n, TOP_K), np.int32)
        for i in range(n):  # distinct ids per position (n is a few hundred: per position, not per row of the run)
            ids[i] = np.unique(np.concatenate([ranks[i], rng.choice(vocab, TOP_K, replace=False)]))[:TOP_K]
            rng.shuffle(ids[i])
        top = np.log(rng.beta(2.0, 2.0, n) * 0.9 + 0.05)
        gaps = rng.exponential(0.6, (n, TOP_K - 1))
        lps = np.concatenate([top[:, None], top[:, None] - np.cumsum(gaps, axis=1)], axis=1).astype(np.float32)
        actual = rng.integers(0, 5, n)
        out[f"m{m:02d}"] = {"ids": ids, "lps": lps, "actual": actual}
    return out


def cell_logprobs(run_id: str, cell, truth: dict, scoring_len: int, shift: float, rep_noise: float,
                  rng) -> pa.Table:
    t = truth[cell.model]
    n_prompt = PROMPTS * (scoring_len - 1)
    n = len(t["lps"])
    tables = {k: [] for k in ("kind", "repeat", "prompt_index", "position", "token_id", "logprob", "ids", "lps")}
    base = t["lps"] + (rng.standard_normal(t["lps"].shape) * shift).astype(np.float32) if shift else t["lps"]
    for rep in (0, 1):
        lps = base + (rng.standard_normal(base.shape) * rep_noise).astype(np.float32) if rep and rep_noise else base
        order = np.argsort(-lps, axis=1, kind="stable")  # an engine returns its top-k most likely first
        lps = np.take_along_axis(lps, order, axis=1).astype(np.float32)
        ids = np.take_along_axis(t["ids"], order, axis=1)
        kind = np.repeat([0, 1], [n_prompt, n - n_prompt])
        pi = np.concatenate([np.repeat(np.arange(PROMPTS), scoring_len - 1), np.repeat(np.arange(PROMPTS), GREEDY)])
        pos = np.concatenate([np.tile(np.arange(1, scoring_len), PROMPTS),
                              np.tile(np.arange(scoring_len, scoring_len + GREEDY), PROMPTS)])
        # teacher forced: the prompt's own next token (the truth's, at a fixed rank); greedy: the top-1
        actual = np.where(kind == 0, np.take_along_axis(t["ids"], t["actual"][:, None], axis=1)[:, 0], ids[:, 0])
        where = np.argmax(ids == actual[:, None], axis=1)
        lp = np.take_along_axis(lps, where[:, None], axis=1)[:, 0]
        for k, v in zip(tables, (kind, np.full(n, rep), pi, pos, actual, lp, ids, lps)):
            tables[k].append(v)
    cat = {k: np.concatenate(v) for k, v in tables.items()}
    rows = len(cat["kind"])
    topk = lambda a, t_: pa.FixedSizeListArray.from_arrays(pa.array(a.reshape(-1), t_), TOP_K).cast(pa.list_(t_))  # noqa: E731
    return pa.table({  # the columns orchestrator.execution.engine_child.rows.read_logprob_rows builds from an engine's output
        "run_id": pa.array([run_id] * rows, pa.string()), "cell_id": pa.array([cell.cell_id] * rows, pa.string()),
        "kind": pa.array(np.where(cat["kind"] == 0, "prompt", "generation")),
        "repeat": cat["repeat"].astype(np.int16), "prompt_index": cat["prompt_index"].astype(np.int32),
        "position": cat["position"].astype(np.int32), "token_id": cat["token_id"].astype(np.int32),
        "logprob": cat["logprob"].astype(np.float32), "topk_ids": topk(cat["ids"], pa.int32()),
        "topk_logprobs": topk(cat["lps"], pa.float32()),
    }, schema=LOGPROBS_SCHEMA)


def measured(cell, status: str, rng, started: str) -> dict:
    """What the launcher adds to cell_row's configuration columns for a finished cell (the columns CELLS_SCHEMA has)."""
    size = 1 + int(cell.model[1:]) % 6 * 12
    facts = {"node_id": f"{rng.integers(1 << 48):012x}", "attempt": 1, "started_at": started,
             "versions": json.dumps({cell.framework: "1.0.0", "torch": "2.13.0"}), "notes": "[]",
             "engine_args": json.dumps({"model": cell.model, "dtype": cell.quantization, **cell.options}),
             "mem_source": "nvml-tree", "batch_mode": "batched", "load_s": float(20 + size * rng.uniform(0.5, 1.5)),
             "load_peak_mem_bytes": int(size * 2.2e9), "status": status}
    if status != "ok":
        reasons = {"unsupported": f"{cell.framework} does not run quantization {cell.quantization}",
                   "failed": "RuntimeError: CUDA error: an illegal memory access was encountered\nTraceback (most "
                             "recent call last):\n" + "  File \"adapters/worker/group.py\", line 120, in run_cell\n" * 12,
                   "crashed": "engine process killed by SIGSEGV while running this cell; last output:\n"
                              + "\n".join(f"[engine] step {i}" for i in range(20)),
                   "timeout": "killed after the cell timeout 900s; last output:\n[engine] warming up"}
        return facts | {"reason": reasons[status]}
    repeats, b = 3, cell.batch_size
    per_seq = 4000 / size * FW_SPEED[cell.framework] * QUANT_SPEED[cell.quantization] * (
        1 + 0.05 * ("default f1 f2 f3".split().index(cell.flags) % 3 - 1))
    prefill_ms = cell.input_len * b / (per_seq * 60) * 1000
    tpot = rng.lognormal(math.log(1000 / per_seq * b ** 0.15), 0.05, repeats * b)
    ttft = rng.lognormal(math.log(prefill_ms + 5), 0.08, repeats * b)
    e2e = ttft + tpot * (cell.output_len - 1)
    runs = b * cell.output_len / (e2e.reshape(repeats, b).max(axis=1) / 1000)
    pct = {name: np.percentile(x, (50, 90, 99)).tolist() for name, x in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e))}
    pct["itl"] = pct["tpot"]
    return facts | {
        "requests": repeats * b, "ttft_ms": ttft.tolist(), "tpot_ms": tpot.tolist(), "e2e_ms": e2e.tolist(),
        **{f"{name}_ms_p{q}": v for name, vs in pct.items() for q, v in zip((50, 90, 99), vs)},
        "output_tok_s": float(runs.mean()), "output_tok_s_runs": runs.tolist(),
        "total_tok_s": float(runs.mean() * (cell.input_len + cell.output_len) / cell.output_len),
        "req_s": float(runs.mean() / cell.output_len), "peak_mem_bytes": int(size * 2.4e9 + b * 3e7),
        "kv_budget_bytes": int(20e9), "duration_s": float(e2e.sum() / 1000 * 1.3),
    }


_PLAN: dict = {}   # what the writer processes share (inherited through fork)


def _write_slice(part: int, parts: int) -> int:
    """Write cells part, part + parts, ... of the plan with RunStore.write_cell; returns logprob rows."""
    p = _PLAN
    store, allowed, rows, t0 = RunStore(p["run_dir"]), set(CELLS_SCHEMA.names), 0, time.monotonic()
    for i in range(part, len(p["cells"]), parts):
        cell, status = p["cells"][i], p["statuses"][i]
        rng = np.random.default_rng([p["seed"], i])   # per cell: the same values whatever --jobs is
        row = cell_row(p["jobs"][cell.engine_key], cell, status) | measured(cell, status, rng, p["started"])
        row = {k: v for k, v in row.items() if k in allowed}
        lp = None
        if status == "ok":
            shift = QUANT_SHIFT[cell.quantization] + FW_SHIFT[cell.framework] + (1e-7 if cell.flags != "default" else 0)
            if cell.batch_size > 1 and cell.framework != "hf":
                shift += 1e-6                              # batch variance
            rep_noise = 1e-7 if cell.framework in ("vllm", "trtllm") else 0.0   # run-to-run noise
            lp = cell_logprobs(store.run_id, cell, p["truth"], p["scoring_len"], shift, rep_noise, rng)
            rows += lp.num_rows
        store.write_cell(row, lp)
        if part == 0 and (i // parts + 1) % 5000 == 0:
            print(f"  {i + 1} cells written ({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
    return rows


def generate(run_dir: Path, n_cells: int, n_rows: int, seed: int = 0, jobs: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    n_models = max(1, math.ceil(n_cells / CELLS_PER_MODEL))
    # statuses do not depend on the scoring length: decide them first, then size the scoring
    probe = expand(parse_matrix(matrix_dict(n_models, 24)))
    keep = _sample(probe, n_cells, rng)
    statuses = _statuses([probe[i] for i in keep], rng)
    n_ok = sum(s == "ok" for s in statuses)
    scoring_len = max(2, math.ceil(n_rows / max(n_ok, 1) / (2 * PROMPTS)) - GREEDY + 1)   # at least n_rows
    data = matrix_dict(n_models, scoring_len)
    text = yaml.safe_dump(data, sort_keys=False)
    m = parse_matrix(data)
    all_cells = expand(m)
    cells = [all_cells[i] for i in keep]   # the same points: expand's order does not depend on measure
    store = RunStore(run_dir)
    started = datetime.now(timezone.utc).isoformat()
    manifest.write(store, m, text, cells, started=started)
    t0 = time.monotonic()
    _PLAN.update(run_dir=run_dir, cells=cells, statuses=statuses, seed=seed, started=started, scoring_len=scoring_len,
                 truth=truth_rows(n_models, scoring_len, rng),
                 jobs={g.engine_key: GroupJob(run_id=store.run_id, group=g, matrix=m, device="cuda",
                                              python=sys.executable, cache_dir="/nonexistent", tries=1)
                       for g in group(cells)})
    if jobs > 1:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            rows = sum(pool.starmap(_write_slice, [(j, jobs) for j in range(jobs)]))
    else:
        rows = _write_slice(0, 1)
    manifest.write(store, m, text, cells, started=started, ended=datetime.now(timezone.utc).isoformat())
    return {"cells": len(cells), "ok": n_ok, "rows": rows, "scoring_len": scoring_len, "models": n_models,
            "seconds": time.monotonic() - t0}


def _sample(cells, n: int, rng) -> list[int]:
    """n cell indices (all when fewer), keeping every baseline cell, in expansion order."""
    if len(cells) <= n:
        return list(range(len(cells)))
    base = [i for i, c in enumerate(cells) if (c.framework, c.quantization, c.flags) == ("hf", "fp32", "default")]
    rest = np.setdiff1d(np.arange(len(cells)), base)
    pick = rng.choice(rest, n - len(base), replace=False)
    return sorted(base + pick.tolist())


def _statuses(cells, rng) -> list[str]:
    out = []
    for c in cells:
        if (c.framework, c.quantization) in UNSUPPORTED:
            out.append("unsupported")
        elif (c.framework, c.quantization, c.flags) != ("hf", "fp32", "default") and rng.random() < 0.015:
            out.append(str(rng.choice(["failed", "crashed", "timeout"])))
        else:
            out.append("ok")
    return out


# ------------------------------------------------------------------ measuring a command

def _bench() -> list[str]:
    # not the venv's `bench` script: an editable install runs the checkout it was installed from
    return [sys.executable, "-m", "orchestrator.cli"]


def measure(args: list[str], log: Path) -> dict:
    """Run `bench ARGS` as its own process; wall time, CPU time and the peak RSS of its process tree."""
    import resource

    import psutil

    load = os.getloadavg()[0]   # the machine may be shared: how busy it was when the command started
    # CPU time of the finished process tree: on a shared machine, what the wall time waited on others is not in it
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(log, "w") as out:
        started = time.monotonic()
        proc = subprocess.Popen(_bench() + args, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        peak, ps = 0, psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                tree = [ps] + ps.children(recursive=True)
                peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
            time.sleep(0.05)
        wall = time.monotonic() - started
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime
    return {"cmd": "bench " + " ".join(args[:1]), "rc": proc.returncode, "wall_s": wall, "cpu_s": cpu, "peak_rss": peak,
            "load": load}


def compact_copy(run_dir: Path, copy: Path, work: Path) -> None:
    """Time `bench compact` on a hard-linked copy of run_dir, and check that it folded every row."""
    import pyarrow.parquet as pq

    shutil.rmtree(copy, ignore_errors=True)
    subprocess.run(["cp", "-al", str(run_dir), str(copy)], check=True)   # seconds; copytree(os.link) took minutes
    cells_files = sum(1 for p in (run_dir / "cells").rglob("*.parquet") if not p.name.startswith("compacted-"))
    journals = journal_files(run_dir)
    print(f"compacting a hard-linked copy of {run_dir}: {cells_files} per-cell cells files, {len(journals)} journal "
          f"files ({sum(p.stat().st_size for p in journals) / 2**30:.2f} GiB) ...", file=sys.stderr, flush=True)
    r = measure(["compact", str(copy)], work / "compact.log")
    record = json.loads((copy / "compacted.json").read_text())
    cells = sum(pq.read_metadata(copy / rel).num_rows for rel in record["cells"].values())
    rows = sum(sum(info["rows"]) for info in record["logprobs"].values())
    left = sum(1 for p in copy.rglob("*.parquet") if not p.name.startswith("compacted-"))
    left += len(journal_files(copy))
    print(f"\nfolded into {len(record['cells']) + len(record['logprobs'])} files: {cells} cells, {rows:,} logprob "
          f"rows, {left} per-cell or journal files left; {os.cpu_count()} CPUs")
    print(_table([r], "journal" if journals else "per-cell"), flush=True)
    if r["rc"] != 0:
        print((work / "compact.log").read_text()[-3000:], file=sys.stderr)
    shutil.rmtree(copy, ignore_errors=True)


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# ------------------------------------------------------------------ storage (real logprobs)

def storage(work: Path) -> list[tuple[str, int, int]]:
    """(label, bytes, logprob rows) of real tiny-model logprobs, stored several ways.

    Three cells with different values (the hf adapter at fp32, bf16 and fp16, batch 1), each
    captured with the measure defaults. hf on CPU repeats itself bitwise, so repeat 1 costs
    little; the "repeat 0 only" rows are the worst case, where no value occurs twice."""
    import pyarrow.parquet as pq

    from adapters.contract.specs import LoadSpec, ModelSpec, ScoringSpec
    from adapters.engines.hf.adapter import HfAdapter
    from adapters.worker.group import capture_logprobs
    from orchestrator.execution.engine_child.prompts import Tokenizer, scoring_prompts
    from orchestrator.execution.engine_child.rows import read_logprob_rows
    from orchestrator.execution.runner import cache_root
    from orchestrator.inputs.tiny_model import resolve_builtin
    from orchestrator.matrix.models import Measure
    from orchestrator.store.compaction import compact
    from orchestrator.store.schema import LOGPROBS_WRITE_OPTIONS

    model = str(resolve_builtin("tiny", cache_root()))
    measure_ = Measure()   # the defaults a matrix gets: 8 prompts x 64 tokens, 16 greedy, 2 repeats, top-k 20
    scoring = ScoringSpec(prompts=scoring_prompts(measure_, Tokenizer(model)), top_k=measure_.top_k,
                          greedy_tokens=measure_.greedy_tokens, repeats=measure_.score_repeats)
    store = RunStore(work / "storage-run")
    tables = []
    for i, dtype in enumerate(("fp32", "bf16", "fp16")):
        adapter = HfAdapter()
        adapter.load(LoadSpec(framework="hf", model=ModelSpec(name="tiny", source=model), quantization=dtype,
                              device="cpu"))
        np.savez(work / "lp.npz", **capture_logprobs(adapter, scoring, 1))
        adapter.close()
        cid = f"{i:016x}"
        t = read_logprob_rows(store.run_id, cid, work / "lp.npz")
        tables.append(t)
        store.write_cell({"run_id": store.run_id, "cell_id": cid, "framework": "hf", "status": "ok"}, t)
    rows = sum(t.num_rows for t in tables)
    lp_dir = store.root / "logprobs"
    old = work / "old.parquet"
    # as a run writes them: the logprobs messages of the journal's records (zstd-compressed IPC)
    journal_bytes = sum(rec.parts["logprobs"][1] for path in journal_files(store.root) for rec in scan(path)[1])
    out = [("journal records (as a run writes them), current writer", journal_bytes, rows),
           ("per-cell files (as runs before the journal wrote them)",
            sum(_parquet_bytes(t, LOGPROBS_WRITE_OPTIONS, old) for t in tables), rows)]
    old = work / "old.parquet"
    old = work / "old.parquet"
    size = 0
    for t in tables:
        pq.write_table(t, old, compression="zstd")
        size += old.stat().st_size
    out.append(("per-cell files, previous writer (zstd, dictionary floats)", size, rows))
    compact(store)
    out.append(("compacted (bench run's end state), current writer",
                sum(f.stat().st_size for f in lp_dir.rglob("*.parquet")), rows))
    rep0 = pa.concat_tables([t.filter(pc.equal(t["repeat"], 0)) for t in tables])
    fp32 = tables[0].filter(pc.equal(tables[0]["repeat"], 0))
    # a 128k vocabulary: the same logprobs with each row's ids drawn (distinct, Zipf-like) from 128,000
    rng = np.random.default_rng(0)
    n, k = fp32.num_rows, TOP_K
    ranks = np.minimum(rng.zipf(1.1, size=(n, 4 * k)), 128_000) - 1
    ids = np.array([np.unique(r)[:k] if len(np.unique(r)) >= k else
                    np.concatenate([np.unique(r), rng.choice(128_000, k, replace=False)])[:k] for r in ranks], np.int32)
    ids = np.take_along_axis(ids, rng.permuted(np.tile(np.arange(k), (n, 1)), axis=1), axis=1)
    wide = fp32.set_column(fp32.schema.get_field_index("topk_ids"), "topk_ids",
                           pa.FixedSizeListArray.from_arrays(pa.array(ids.reshape(-1)), k).cast(pa.list_(pa.int32())))
    wide = wide.set_column(wide.schema.get_field_index("token_id"), "token_id", pa.array(ids[:, 0]))
    for what, table in (("3 cells, repeat 0 only (no value twice)", rep0), ("fp32 cell, repeat 0 only", fp32),
                        ("fp32, repeat 0, ids from a 128k vocabulary", wide)):
        for label, options in (("current", LOGPROBS_WRITE_OPTIONS), ("previous", {"compression": "zstd"})):
            pq.write_table(table, old, **options)
            out.append((f"{what}, {label} writer", old.stat().st_size, table.num_rows))
    return out


def _parquet_bytes(table: pa.Table, options: dict, path: Path) -> int:
    import pyarrow.parquet as pq

    pq.write_table(table, path, **options)
    return path.stat().st_size


# ------------------------------------------------------------------ main

def _table(rows: list[dict], layout: str) -> str:
    lines = [f"{'command':<16} {'layout':<10} {'wall s':>8} {'CPU s':>7} {'peak RSS GiB':>13} {'exit':>5} {'load':>5}  "
             f"goal", "-" * 92]
    for r in rows:
        # compaction: <60 s and <2 GiB (issue 20); the commands: <60 s and <4 GiB
        wall, rss = (60, 2) if r["cmd"] == "bench compact" else (60, 4)
        ok = r["wall_s"] < wall and r["peak_rss"] < rss * 2**30
        lines.append(f"{r['cmd']:<16} {layout:<10} {r['wall_s']:>8.1f} {r['cpu_s']:>7.1f} {r['peak_rss'] / 2**30:>13.2f} "
                     f"{r['rc']:>5} {r['load']:>5.1f}  <{wall} s, <{rss} GiB: {'met' if ok else 'MISSED'}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", type=int, default=100_000)
    ap.add_argument("--rows", type=int, default=20_000_000, help="logprob rows in all (about)")
    ap.add_argument("--dir", type=Path, default=None, help="where the run goes (default: a temporary directory)")
    ap.add_argument("--keep", action="store_true", help="keep the run directory")
    ap.add_argument("--reuse", action="store_true", help="use the run already in --dir (no generation)")
    ap.add_argument("--per-cell", action="store_true", help="also time compare/gate/report before compacting")
    ap.add_argument("--no-storage", action="store_true", help="skip the bytes-per-token measurement")
    ap.add_argument("--storage-only", action="store_true")
    ap.add_argument("--compact-only", action="store_true",
                    help="only time `bench compact`, on a hard-linked copy of the run (the run stays per-cell)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1, help="processes writing the synthetic cells")
    ap.add_argument("--quick", action="store_true", help="300 cells, 30,000 logprob rows, for CI (every step)")
    args = ap.parse_args()
    if args.quick:
        args.cells, args.rows = 300, 30_000
    broken = False
    work = args.dir or Path(tempfile.mkdtemp(prefix="bench-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        if not args.storage_only:
            run_dir = work / "run"
            if not args.reuse:
                shutil.rmtree(run_dir, ignore_errors=True)
                print(f"writing {args.cells} cells into {run_dir} (RunStore.write_cell) ...",
                      file=sys.stderr, flush=True)
                g = generate(run_dir, args.cells, args.rows, args.seed, args.jobs)
                print(f"written: {g['cells']} cells ({g['ok']} ok), {g['rows']:,} logprob rows (scoring_len "
                      f"{g['scoring_len']}, {g['models']} models) in {g['seconds']:.0f} s", flush=True)
            if args.compact_only:
                compact_copy(run_dir, work / "run-compacted", work)
                return
            policy = work / "policy.yaml"
            policy.write_text(yaml.safe_dump({"rules": [
                {"match": {"framework": "vllm", "quantization": ["fp16"]}, "must_be": "lossless"},
                {"match": {"framework": "hf", "quantization": "fp32"}, "must_be": "identical"}]}))
            commands = [["compare", str(run_dir)], ["gate", str(run_dir), "--policy", str(policy)],
                        ["report", str(run_dir), "-o", str(work / "report.html")]]
            if args.per_cell:
                results = [measure(c, work / f"{c[0]}-per-cell.log") for c in commands]
                print("\n" + _table(results, "per-cell"), flush=True)
            compacted = [measure(["compact", str(run_dir)], work / "compact.log")]
            results = compacted + [measure(c, work / f"{c[0]}.log") for c in commands]
            n_files = sum(1 for _ in run_dir.rglob("*.parquet"))
            print(f"\n{args.cells} cells, {args.rows:,} logprob rows wanted; {n_files} Parquet files after compaction; "
                  f"{os.cpu_count()} CPUs")
            print(_table(results, "compacted"), flush=True)
            lp_bytes = dir_bytes(run_dir / "logprobs")
            print(f"synthetic logprobs on disk: {lp_bytes / 2**20:.0f} MiB (values are synthetic: see the storage "
                  f"table for real ones); report.html {(work / 'report.html').stat().st_size / 2**20:.1f} MiB")
            for r in results:
                if r["rc"] not in (0, 1):
                    log = work / f"{r['cmd'].split()[1]}.log"
                    print(f"{r['cmd']} exited {r['rc']}:\n{log.read_text()[-3000:]}", file=sys.stderr)
                    broken = True
        if not args.no_storage:
            print("\nstorage of real logprobs (builtin:tiny through the hf adapter, measure defaults, top-k 20):")
            print(f"{'layout / writer':<66} {'rows':>7} {'B/token':>8} {'B/(token,cand)':>15}")
            print("-" * 99)
            for label, size, rows in storage(work):
                print(f"{label:<66} {rows:>7} {size / rows:>8.1f} {size / rows / TOP_K:>15.2f}")
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if broken else 0)


if __name__ == "__main__":
    main()
