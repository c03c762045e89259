"""What test files in several folders share; tests/conftest.py holds the fixtures.

The repo root, the small matrix, `bench` as a child process, and the helpers of the files that were
split by what their tests cost (tests/unit, tests/engines, tests/e2e): each section names its users.
Import it as `tests.helpers` (pyproject's pytest `pythonpath` puts the repo root on sys.path).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import multiprocessing
import re
import os
import shutil
import signal
import subprocess
import sys
import traceback
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from adapters.contract.specs import LoadSpec, ModelSpec
from adapters.engines.llamacpp.adapter import LlamacppAdapter
from adapters.serving import server_process
from orchestrator.matrix.cells import expand
from orchestrator.matrix.models import MatrixError
from orchestrator.matrix.validate import parse_matrix
from orchestrator.store.run_store import RunStore
from orchestrator.store.schema import LOGPROBS_SCHEMA, TASKS_SCHEMA

ROOT = Path(__file__).resolve().parent.parent   # the repo: tests/helpers.py is one folder down

SMALL_MATRIX = {
    "name": "small",
    "models": {"tiny": "builtin:tiny"},
    "axes": {"framework": ["hf"], "model": ["tiny"], "quantization": ["fp32"], "batch_size": [1, 2],
             "input_len": [16], "output_len": [6]},
    "measure": {"warmup": 1, "repeats": 2, "scoring_prompts": 2, "scoring_len": 24, "greedy_tokens": 5,
                "score_repeats": 2, "top_k": 8},
    "run": {"cell_timeout_s": 120, "load_timeout_s": 300},
}

# hf and llama.cpp fp32 (its default: near-lossless) with the logit and text layers only: what `bench explain`
# needs (e2e/test_explain.py, e2e/test_explain_layers.py)
EXPLAIN_MATRIX = {
    "name": "explain",
    "models": {"tiny": "builtin:tiny"},
    "axes": {"framework": ["hf", "llamacpp"], "model": ["tiny"], "quantization": ["fp32"], "batch_size": [1],
             "input_len": [16], "output_len": [4]},
    "measure": {"warmup": 0, "repeats": 1, "scoring_prompts": 2, "scoring_len": 64, "greedy_tokens": 8,
                "score_repeats": 2},
    "run": {"cell_timeout_s": 120, "load_timeout_s": 300},
}



def bench_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator.cli", *args]


# -- vLLM scripts (engines/test_sampling_engines.py, engines/test_gguf_converter.py) -----------------------
# Each of those modules registers the script it runs in .venvs/vllm (@vllm_script); tests/conftest.py's session
# fixture `vllm_scripts` runs every registered one at once. A vLLM engine start is mostly one core importing
# vLLM (~11 s of CPU a process: the script, its engine core, its worker), so two scripts side by side use both
# cores of a 2-core host: 114 s for these two, 167 s one after the other. Only the modules collected register.

VLLM_SCRIPTS: dict = {}


def vllm_script(name: str):
    """Register `build(tiny_model, cache_dir) -> (script text, cfg)`: the script runs as
    `.venvs/vllm/bin/python SCRIPT JSON(cfg)` when the first test asks `vllm_scripts` for any script."""
    def register(build):
        VLLM_SCRIPTS[name] = build
        return build
    return register


def run_engine_scripts(jobs: dict[str, list[str]], workdir: Path, timeout: float,
                       **kwargs) -> dict[str, subprocess.CompletedProcess]:
    """Scripts that start engines in processes of their own (vLLM's engine core and workers), run at once: each
    in a process group of its own (its output in files under workdir), all waited for, and each group SIGKILLed
    whole when its script ends or the shared timeout passes (a timeout alone would kill the script, not the
    engine's processes), so no engine process outlives them."""
    import time

    procs = {}
    for name, argv in jobs.items():
        out, err = open(workdir / f"{name}.out", "w+"), open(workdir / f"{name}.err", "w+")
        procs[name] = (argv, subprocess.Popen(argv, stdout=out, stderr=err, text=True, start_new_session=True,
                                              **kwargs), out, err)
    deadline, results = time.monotonic() + timeout, {}
    try:
        for name, (argv, proc, out, err) in procs.items():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                late = ""
            except subprocess.TimeoutExpired:
                late = f"timed out after {timeout:g}s"
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
            out.seek(0)
            err.seek(0)
            results[name] = subprocess.CompletedProcess(argv, proc.returncode, out.read(), err.read() + late)
    finally:
        for argv, proc, out, err in procs.values():
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
            out.close()
            err.close()
    return results


BUILTIN_TASK_NAMES = ["tiny-lastword", "tiny-continue", "tiny-ending"]   # unit/test_task_stats.py, e2e/test_tasks.py


def problems(data) -> list[str]:
    """What a matrix's validation and expansion say is wrong with it (unit/test_matrix.py,
    unit/test_workload_axis.py)."""
    with pytest.raises(MatrixError) as info:
        expand(parse_matrix(data))
    return info.value.problems


# -- chat and ShareGPT (unit/test_chat.py, unit/test_workloads.py, engines/test_chat_gguf.py,
# e2e/test_chat_run.py, e2e/test_workloads_run.py) ----------------------------------------------------

SHAREGPT = str(ROOT / "tests" / "data" / "sharegpt_multiturn.json")
MSGS = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "When do you open?"}]


def without_template(model_dir, dst):
    """A copy of a model dir with its chat template taken out (a local model without one)."""
    shutil.copytree(model_dir, dst)
    cfg = json.loads((dst / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    return dst


def chat_matrix(source: str, **workload) -> dict:
    return {"models": {"m": source}, "axes": {"framework": ["hf"], "model": ["m"]},
            "workload": {"kind": "sharegpt", "path": SHAREGPT, "chat": True, **workload}}


# -- hf datasets (unit/test_hf_datasets.py, e2e/test_hf_datasets_run.py) ---------------------------

HF_DATA = str(ROOT / "tests" / "data" / "hf_dataset")
HF_OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


def hf_matrix(**workload) -> dict:
    return {"models": {"tiny": "builtin:tiny"}, "axes": {"framework": ["hf"], "model": ["tiny"]},
            "workload": {"kind": "hf", "name": HF_DATA, **workload}}


# -- stored rows (unit/test_compaction.py, unit/test_journal.py, e2e/test_store_processes.py) -------

def lp(cell_id: str, n: int = 6, value: float = -1.0) -> pa.Table:
    return pa.table({
        "run_id": ["r"] * n, "cell_id": [cell_id] * n, "kind": ["prompt"] * n, "repeat": np.zeros(n, np.int16),
        "prompt_index": np.zeros(n, np.int32), "position": np.arange(1, n + 1, dtype=np.int32),
        "token_id": np.arange(n, dtype=np.int32), "logprob": np.full(n, value, np.float32),
        "topk_ids": [[1, 2, 3]] * n, "topk_logprobs": [[value, value - 1, value - 2]] * n}, schema=LOGPROBS_SCHEMA)


def row(cell_id: str, framework: str = "hf", status: str = "ok", **extra) -> dict:
    return {"run_id": "r", "cell_id": cell_id, "framework": framework, "model": "tiny", "quantization": "fp32",
            "flags": "default", "batch_size": 1, "input_len": 8, "output_len": 4, "status": status, **extra}


def small_store(tmp_path, legacy: bool = False) -> RunStore:
    """Six cells over two frameworks; c3 failed (no logprobs). `legacy`: as earlier versions stored
    them (a Parquet file per cell and table), else in the journal."""
    store = RunStore(tmp_path / "run")
    for i in range(6):
        fw, status = ("hf" if i % 2 else "vllm"), ("failed" if i == 3 else "ok")
        (store.write_cell_files if legacy else store.write_cell)(
            row(f"c{i}", fw, status, reason="boom" if status != "ok" else None),
            lp(f"c{i}", 4 + i, -float(i)) if status == "ok" else None)
    return store


def logprob_npz(path, n=50, k=4, seed=0):
    """A cell's outputs as the engine child writes them (unit/test_logprob_rows.py, e2e/test_harness_costs.py)."""
    rng = np.random.default_rng(seed)
    data = {"kind": rng.integers(0, 2, n).astype(np.int8), "repeat": rng.integers(0, 3, n).astype(np.int16),
            "prompt_index": rng.integers(0, 9, n).astype(np.int32), "position": np.arange(n, dtype=np.int32),
            "token_id": rng.integers(0, 500, n).astype(np.int32), "logprob": rng.random(n).astype(np.float32),
            "topk_ids": rng.integers(0, 500, (n, k)).astype(np.int32),
            "topk_logprobs": rng.random((n, k)).astype(np.float32)}
    np.savez(path, **data)
    return data


# -- llama.cpp (engines/test_llamacpp.py, unit/test_llamacpp_files.py; e2e/test_serve.py and
# e2e/test_workloads_run.py start its server) -------------------------------------------------------

HAVE_LLAMA = importlib.util.find_spec("llama_cpp") is not None
needs_llama = pytest.mark.skipif(
    not HAVE_LLAMA, reason="llama-cpp-python is not installed (pip install -e '.[llamacpp]')")
KV_F32 = {"type_k": "f32", "type_v": "f32", "flash_attn": "off", "n_threads": 1}
API = LlamacppAdapter.server_api


def start_llamacpp(path: str, log) -> server_process.ServerProcess:
    """llama-cpp-python's server on one GGUF, through the adapter's own command."""
    spec = LoadSpec(framework="llamacpp", model=ModelSpec(name="tiny", source=path), quantization="gguf",
                    options=KV_F32, device="cpu", context_len=128)
    port = server_process.free_port()
    return server_process.ServerProcess(LlamacppAdapter().server(spec, port), port, str(log), 180,
                                        API.health_path).start()


# -- the cluster files (unit/test_cluster_configs.py, e2e/test_cluster_scripts.py) -----------------

CLUSTER = ROOT / "cluster"
SBATCH = CLUSTER / "slurm" / "bench.sbatch"
CI_SCRIPT = CLUSTER / "ci" / "run-regression.sh"
GCS_PORT, DASHBOARD_PORT = 6379, 8265


def ray_start_options() -> set[str]:
    from ray.scripts.scripts import start

    return {o for p in start.params for o in p.opts if o.startswith("--")}


def flags(argv: list[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in argv if a.startswith("--")}


def check_ray_start(argv: list[str]) -> None:
    assert argv[:2] == ["ray", "start"], argv
    unknown = flags(argv[2:]) - ray_start_options()
    assert not unknown, f"`{' '.join(argv)}`: ray start has no option {sorted(unknown)}"


# -- the report's task layer on a run made by hand (unit/test_report_tasks.py, e2e/test_report.py) --

TASK_ITEMS = 111
QA_RIGHT = 67      # the baseline gets 67 of 111 qa items right (60%)
QA_FLIPPED = 20    # vllm q4_0 gets 20 of those wrong: a regression McNemar's test sees (p = 2 * 0.5**20)


def task_rows(cell_id: str, flipped: int = 0, summ_run: bool = True):
    """qa (exact_match, 0/1) and summ (rouge_l, continuous) rows of one cell, in TASKS_SCHEMA."""
    qa = [1.0 if i < QA_RIGHT else 0.0 for i in range(TASK_ITEMS)]
    qa[:flipped] = [0.0] * flipped
    summ = np.random.default_rng(0).uniform(0.1, 0.9, TASK_ITEMS).round(3).tolist()
    rows = [dict(run_id="r", cell_id=cell_id, task="qa", metric="exact_match", item_index=i, score=s)
            for i, s in enumerate(qa)]
    if summ_run:
        rows += [dict(run_id="r", cell_id=cell_id, task="summ", metric="rouge_l", item_index=i, score=s)
                 for i, s in enumerate(summ)]
    return pa.Table.from_pylist(rows, schema=TASKS_SCHEMA)


def task_logprobs(cell_id: str, shift: float = 0.0):
    """Two prompts teacher forced over 3 positions, 3 greedy tokens each, two repeats; every logprob
    moved by `shift` (0: bitwise equal to the baseline)."""
    f32 = np.float32
    top = [float(f32(np.log(p) + shift)) for p in (0.5, 0.3, 0.1)]
    out = []
    for rep in (0, 1):
        for pi in (0, 1):
            for pos in (1, 2, 3):
                out.append(dict(run_id="r", cell_id=cell_id, kind="prompt", repeat=rep, prompt_index=pi, position=pos,
                                token_id=12, logprob=top[2], topk_ids=[10, 11, 12], topk_logprobs=top))
            for pos, tok in zip((4, 5, 6), (20 + pi, 30 + pi, 40 + pi)):
                out.append(dict(run_id="r", cell_id=cell_id, kind="generation", repeat=rep, prompt_index=pi,
                                position=pos, token_id=tok, logprob=top[0], topk_ids=[tok, tok + 100, tok + 200],
                                topk_logprobs=top))
    return pa.Table.from_pylist(out, schema=LOGPROBS_SCHEMA)


def task_run_by_hand(root: Path, q4_flipped: int) -> Path:
    """A run made by hand: hf fp32 (the baseline), vllm fp32 (the same logprobs and task results,
    1.5x faster) and vllm q4_0 (shifted logprobs, 3x faster, `q4_flipped` qa items right -> wrong,
    summ not run)."""
    store = RunStore(root)
    store.write_manifest({"run_id": root.name, "matrix": {
        "name": "tasks", "baseline": {"framework": "hf", "quantization": "fp32"}, "tolerances": {},
        "tasks": ["qa", "summ"]}})
    for cid, fw, quant, speed, shift, flipped in (("base", "hf", "fp32", 1.0, 0.0, 0),
                                                  ("same", "vllm", "fp32", 1.5, 0.0, 0),
                                                  ("q4", "vllm", "q4_0", 3.0, 0.02, q4_flipped)):
        tok_s = [100.0 * speed * f for f in (1.0, 1.02, 0.98)]
        row = dict(run_id=root.name, cell_id=cid, engine_key=f"{fw}/{quant}/default", framework=fw, model="tiny",
                   quantization=quant, flags="default", batch_size=1, input_len=32, output_len=16, mode="offline",
                   load="batch", status="ok", output_tok_s=float(np.mean(tok_s)), output_tok_s_runs=tok_s,
                   ttft_ms_p50=10.0 / speed, peak_mem_bytes=1000,
                   missing=json.dumps({"task:summ": "lm-eval is not installed"} if cid == "q4" else {}))
        store.write_cell(row, task_logprobs(cid, shift), task_rows(cid, flipped, summ_run=cid != "q4"))
    return root


def html_table(text: str, table_id: str) -> list[dict[str, tuple[str, str]]]:
    """key -> (data-v, text shown) of every body row of a sortable table of the page."""
    table = re.search(rf'<table class="sortable" id="{table_id}">(.*?)</table>', text, re.S).group(1)
    keys = re.findall(r'<th data-key="([^"]+)"', table)
    body = re.search(r"<tbody>(.*?)</tbody>", table, re.S).group(1)
    return [dict(zip(keys, re.findall(r'<td[^>]*data-v="([^"]*)"[^>]*>(.*?)</td>', tr)))
            for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)]


def md_table(md: str, heading: str) -> list[list[str]]:
    """The body rows of the first Markdown table after `heading`, split into cells."""
    lines = md[md.index(heading):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
    return rows


# -- the served run: one `bench run` that e2e/test_serve.py and e2e/test_chat_run.py both read -------
# (tests/conftest.py's session fixture `served_run`). Its two workloads share each engine's load and server:
# one vLLM server (and one llama.cpp server) serves the synthetic load points and the chat conversations.

SERVE_REQUESTS, SERVE_REPEATS, SERVE_IN, SERVE_OUT = 8, 2, 16, 8
CHAT_WARMUP, CHAT_BATCH, CHAT_IN_CAP, CHAT_OUT_CAP = 1, 2, 320, 8
CHAT_WORKLOAD = {"kind": "sharegpt", "path": SHAREGPT, "multi_turn": True, "think_time_s": 0.02, "chat": True}


def served_matrix(endpoint: str) -> dict:
    """`synthetic` (test_serve): every framework offline and served at three load points, and "ep", a server
    someone else runs (`endpoint`: nothing is started for it); `chat` (test_chat_run): the ShareGPT file as chat,
    served by vLLM and llama.cpp, offline through llama.cpp (batch 2) and transformers (batch 1: it takes one
    output length per batch, so each turn gets its reply's length)."""
    chat = {"workload": "chat", "model": "tiny", "request_rate": float("inf"), "input_len": CHAT_IN_CAP,
            "output_len": CHAT_OUT_CAP}
    return {
        "name": "served",
        "models": {"tiny": "builtin:tiny", "ep": {"source": "builtin:tiny", "endpoint": endpoint}},
        "axes": {"framework": ["hf", "llamacpp", "vllm"], "model": ["tiny", "ep"], "quantization": ["fp32"],
                 "mode": ["offline", "serve"], "batch_size": [1, 4], "request_rate": [float("inf"), 8.0],
                 "input_len": [SERVE_IN], "output_len": [SERVE_OUT], "workload": ["synthetic"]},
        "workloads": {"synthetic": {"kind": "synthetic"}, "chat": CHAT_WORKLOAD},
        # vLLM eager (no torch.compile at start, as every other vLLM test runs it); the compiled path is the smoke matrix's
        "flags": {"llamacpp": {"default": KV_F32}, "vllm": {"default": {"enforce_eager": True}}},
        "exclude": [{"mode": "serve", "request_rate": 8.0, "batch_size": 1},
                    {"model": "ep", "framework": ["hf", "vllm"]}, {"model": "ep", "batch_size": 4}],
        # vLLM offline would add an engine group (~half a minute) for the path llama.cpp's batch-2 cell covers
        "include": [chat | {"framework": "vllm", "mode": "serve", "batch_size": CHAT_BATCH},
                    chat | {"framework": "llamacpp", "mode": "serve", "batch_size": CHAT_BATCH},
                    chat | {"framework": "llamacpp", "mode": "offline", "batch_size": CHAT_BATCH},
                    chat | {"framework": "hf", "mode": "offline", "batch_size": 1}],
        "serve": {"requests": SERVE_REQUESTS, "time_limit_s": 120, "request_timeout_s": 120, "slo_ttft_ms": 60000},
        "measure": {"warmup": CHAT_WARMUP, "repeats": SERVE_REPEATS, "scoring_prompts": 3, "scoring_len": 24,
                    "greedy_tokens": 8, "score_repeats": 2, "top_k": 8},
        # each served cell against its own engine offline
        "baseline": {"model": "tiny", "mode": "offline"},
        # the task layer through the servers: 20 choice items (teacher-forced prompt logprobs by id)
        "tasks": [{"kind": "choice", "name": "ending20", "limit": 20,
                   "path": str(ROOT / "orchestrator/inputs/data/tasks/tiny-ending.jsonl")}],
        "run": {"cell_timeout_s": 300, "load_timeout_s": 600},
    }


def in_own_session(test):
    """Runs the test's body in a forked child that leads a session of its own, as the engine child does in a run
    (what adapters/contract/disturbance.py counts as the engine's own is its session: the pytest process's is whatever
    launched it, under CI a whole process tree); its failure fails the test."""
    @functools.wraps(test)
    def run():
        ctx = multiprocessing.get_context("fork")
        result = ctx.Queue()

        def child():
            os.setsid()
            try:
                test()
                result.put(None)
            except BaseException:
                result.put(traceback.format_exc())

        proc = ctx.Process(target=child)
        proc.start()
        failure = result.get(timeout=120)
        proc.join(timeout=30)
        if failure is not None:
            pytest.fail(failure, pytrace=False)
    return run


def turn_order(row) -> list[tuple[str, int]]:
    """A paired cell's timed repeats and its baseline's (base_repeat_*), in wall-clock order as (side, repeat);
    fails where two of them overlapped."""
    spans = sorted([(float(s), float(e), "cell", i) for i, (s, e) in
                    enumerate(zip(row["repeat_started_at"], row["repeat_ended_at"]))]
                   + [(float(s), float(e), "base", i) for i, (s, e) in
                      enumerate(zip(row["base_repeat_started_at"], row["base_repeat_ended_at"]))])
    for (_, end, *_), (start, *_) in zip(spans, spans[1:]):
        assert end <= start, "two timed repeats overlapped"
    return [(side, i) for *_, side, i in spans]


def abba(repeats: int) -> list[tuple[str, int]]:
    """cell, base, base, cell, cell, base, ...: the order paired repeats take turns in."""
    return [(side, r) for r in range(repeats) for side in (("cell", "base") if r % 2 == 0 else ("base", "cell"))]
