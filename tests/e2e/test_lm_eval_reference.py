"""The task layer against the reference: lm-eval's own evaluator (its HF backend, in process, CPU) and
`bench run` on the same local tasks, one of each request type, compared item by item.

    ref_boundary_mc   multiple_choice: contexts that end mid-word (a token spans the boundary), with a
                      trailing space, and choices whose characters are not bytes (acc, acc_norm, acc_bytes)
    ref_lastword_ll   loglikelihood: perplexity and acc of each item's last word
    ref_rolling       loglikelihood_rolling: word_perplexity, byte_perplexity, bits_per_byte; max_length 64 on
                      both sides, so documents span several of lm-eval's rolling windows
    ref_gen           generate_until: greedy text cut at lm-eval's stop sequences (no filter: the raw text)
    ref_delim_mc      multiple_choice with lm-eval's default target_delimiter " " and choices written without it
                      (the built-in tiny-ending's items): acc_norm divides by the choice alone
Every task and metric is one bench task entry (`name: <task>-<metric>`), so each figure bench reports is
checked against the figure lm-eval reports. The native choice kind reads ref_boundary_mc's JSONL (its
target_delimiter "" as the YAML's) and ref_delim_mc's (the default " "): it must give its lm-eval twins'
picks and scores. Cells: transformers fp32, llama.cpp fp32 with an f32 KV cache,
vLLM-CPU; the transformers cell is held to lm-eval's HF backend at 1e-4 per item, the others at their
logit tolerance (llama.cpp's and vLLM's CPU kernels differ from PyTorch's by ~1e-5 per token).
"""

from __future__ import annotations

import copy
import json
import math
import os

import numpy as np
import pandas as pd
import pytest
import yaml

from adapters.contract.tokenizer import Tokenizer
from orchestrator.execution.runner import run_matrix
from orchestrator.judge.task_verdicts import analyse_tasks
from orchestrator.store.run_store import RunStore
from tests.helpers import ROOT, SMALL_MATRIX

VLLM_PY = ROOT / ".venvs" / "vllm" / "bin" / "python"
TASK_DIR = ROOT / "tests" / "data" / "lm_eval"
MAX_LENGTH = 64
METRICS = {"ref_boundary_mc": ["acc", "acc_norm", "acc_bytes"], "ref_lastword_ll": ["perplexity", "acc"],
           "ref_rolling": ["word_perplexity", "byte_perplexity", "bits_per_byte"], "ref_gen": ["exact_match"],
           "ref_delim_mc": ["acc_norm"]}
MC_TASKS = ("ref_boundary_mc", "ref_delim_mc")
# the native twin of each multiple-choice task: its target_delimiter (the YAML's)
NATIVE_DELIMITER = {"ref_boundary_mc": "", "ref_delim_mc": " "}
# per item: summed loglikelihoods of a choice or a document (nats)
ITEM_ATOL = {"hf": 1e-4, "vllm": 2e-3, "llamacpp": 2e-2}


@pytest.fixture(scope="module")
def reference(tiny_model):
    """lm-eval's own evaluator, HF backend, on the tasks: its samples and its aggregate figures."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    here = os.getcwd()
    os.chdir(TASK_DIR)   # the YAMLs' data_files are relative to their folder
    try:
        out = lm_eval.simple_evaluate(
            model="hf", model_args=f"pretrained={tiny_model},dtype=float32,max_length={MAX_LENGTH}",
            tasks=list(METRICS), task_manager=TaskManager(include_path=str(TASK_DIR), include_defaults=False),
            log_samples=True, bootstrap_iters=0, device="cpu", batch_size=1)
    finally:
        os.chdir(here)
    return {t: sorted(out["samples"][t], key=lambda s: s["doc_id"]) for t in METRICS}, out["results"]


@pytest.fixture(scope="module")
def bench(ray_local, tmp_path_factory, tiny_model):
    assert VLLM_PY.exists(), f"vLLM environment missing ({VLLM_PY}): make env-vllm"
    data = copy.deepcopy(SMALL_MATRIX)
    data["axes"] = {"framework": ["hf", "llamacpp", "vllm"], "model": ["tiny"], "quantization": ["fp32"],
                    "batch_size": [1], "flags": ["ref"], "input_len": [16], "output_len": [4]}
    data["measure"] |= {"repeats": 1, "warmup": 0}
    # vLLM in_process: a load of 3-9 s, not 17-35 s (docs/engines.md); e2e/test_vllm.py keeps its child processes
    data["flags"] = {"vllm": {"ref": {"enforce_eager": True, "cpu_kvcache_space_gib": 0.25, "in_process": True}},
                     "llamacpp": {"ref": {"type_k": "f32", "type_v": "f32", "flash_attn": "off"}},
                     "hf": {"ref": {}}}
    data["tasks"] = [{"kind": "lm_eval", "task": t, "name": f"{t}-{m}", "metric": m, "include_path": str(TASK_DIR),
                      "max_length": MAX_LENGTH} for t, ms in METRICS.items() for m in ms]
    data["tasks"] += [{"kind": "choice", "name": f"native-{t}-{m}", "path": str(TASK_DIR / f"{t}.jsonl"), "metric": m,
                       "target_delimiter": NATIVE_DELIMITER[t]} for t in MC_TASKS for m in METRICS[t]]
    data["run"]["python"] = {"vllm": str(VLLM_PY)}
    data["run"]["cell_timeout_s"] = 900
    d = tmp_path_factory.mktemp("lm_eval_reference")
    (d / "m.yaml").write_text(yaml.safe_dump(data))
    store = run_matrix(d / "m.yaml", d / "run")
    cells = store.read_cells()
    assert set(cells.status) == {"ok"}, cells[["framework", "status", "reason"]]
    items = RunStore(store.root).read_tasks().to_pandas()
    ids = dict(zip(cells.framework, cells.cell_id))
    return ids, items, analyse_tasks(store.root)


def _rows(bench, framework: str, name: str) -> pd.DataFrame:
    ids, items, _ = bench
    rows = items[(items.cell_id == ids[framework]) & (items.task == name)].set_index("item_index").sort_index()
    assert len(rows), (framework, name)
    return rows


def _figure(bench, framework: str, name: str) -> float:
    ids, _, tv = bench
    return float(tv[(tv.cell_id == ids[framework]) & (tv.task == name)].score.iloc[0])


def _table(reference, bench) -> str:
    """The closing note's table: per engine and task figure, bench's and lm-eval's, and the largest per-item gap."""
    samples, results = reference
    lines = ["engine | task-metric | bench | lm-eval HF | max item |diff|"]
    for fw in ("hf", "llamacpp", "vllm"):
        for task, metrics in METRICS.items():
            for m in metrics:
                rows = _rows(bench, fw, f"{task}-{m}")
                if task in MC_TASKS:
                    gap = max(np.abs(np.array(r) - [x[0] for x in s["filtered_resps"]]).max()
                              for r, s in zip(rows.choice_logprobs, samples[task]))
                elif task == "ref_gen":   # generations that differ
                    gap = sum(p != s["filtered_resps"][0] for p, s in zip(rows.prediction, samples[task]))
                elif m == "acc":          # items scored differently
                    gap = sum(a != s[m] for a, s in zip(rows.score, samples[task]))
                else:
                    gap = max(abs(a - _ll(s)) for a, s in zip(rows.score, samples[task]))
                lines.append(f"{fw} | {task}-{m} | {_figure(bench, fw, f'{task}-{m}'):.7g} | "
                             f"{results[task][f'{m},none']:.7g} | {gap:.2g}")
    return "\n".join(lines)


def _ll(sample) -> float:
    """A loglikelihood or rolling sample's loglikelihood, as lm-eval stored its response."""
    resp = sample["filtered_resps"][0] if isinstance(sample["filtered_resps"], list) else sample["filtered_resps"]
    return float(resp[0] if isinstance(resp, (list, tuple)) else resp)


def test_the_items_include_boundary_spanning_tokens(tiny_model):
    tok = Tokenizer(str(tiny_model))
    spans = 0
    for line in (TASK_DIR / "ref_boundary_mc.jsonl").read_text().splitlines():
        item = json.loads(line)
        ctx = item["prompt"].rstrip()
        for c in item["choices"]:
            whole = tok.encode_task(ctx + item["prompt"][len(ctx):] + c)
            spans += whole[:len(tok.encode_task(ctx))] != tok.encode_task(ctx)
    assert spans >= 8, spans


@pytest.mark.parametrize("framework", ["hf", "llamacpp", "vllm"])
def test_every_item_as_lm_eval_scores_it(reference, bench, framework):
    samples, _ = reference
    atol = ITEM_ATOL[framework]
    for task, m in [(t, m) for t in MC_TASKS for m in METRICS[t]]:
        rows, ref = _rows(bench, framework, f"{task}-{m}"), samples[task]
        assert len(rows) == len(ref) == {"ref_boundary_mc": 24, "ref_delim_mc": 111}[task]
        for (i, r), s in zip(rows.iterrows(), ref):
            assert i == s["doc_id"]
            lls = [x[0] for x in s["filtered_resps"]]
            assert np.allclose(r.choice_logprobs, lls, atol=atol, rtol=0), (framework, task, m, i, r.choice_logprobs, lls)
            assert r.score == s[m], (framework, task, m, i)
            if framework == "hf":   # the same pick for every item (the engines' picks: their scores above)
                texts = s["doc"]["choices"]   # lm-eval's choices: without the target_delimiter
                by = {"acc": [1.0] * len(texts), "acc_norm": [len(t) for t in texts],
                      "acc_bytes": [len(t.encode()) for t in texts]}[m]
                assert int(r.prediction) == int(np.argmax(np.array(lls) / by)), (task, m, i)
    for task in ("ref_lastword_ll", "ref_rolling"):
        for m in METRICS[task]:
            rows = _rows(bench, framework, f"{task}-{m}")
            if m == "acc":   # the continuation is the greedy one
                assert list(rows.score) == [float(s[m]) for s in samples[task]], (framework, task)
                continue
            # a perplexity's per-item value is the loglikelihood
            assert np.allclose(rows.score, [_ll(s) for s in samples[task]], atol=atol, rtol=0), (framework, task, m)
            if task == "ref_rolling":   # lm-eval's (loglikelihood, words | bytes): the weights bench stores
                assert list(rows.score_weight) == [float(s[m][1]) for s in samples[task]], (framework, m)
    gen = _rows(bench, framework, "ref_gen-exact_match")
    assert list(gen.prediction) == [s["filtered_resps"][0] for s in samples["ref_gen"]], framework


@pytest.mark.parametrize("framework", ["hf", "llamacpp", "vllm"])
def test_every_figure_is_lm_evals(reference, bench, framework):
    """bench's task figure (its items aggregated by orchestrator/inputs/task_metrics.py) against lm-eval's own:
    1e-6 on transformers (relative for perplexities, which run to 1e9 on this model); on the other engines,
    as close as their items' loglikelihoods allow."""
    _, results = reference
    for task, metrics in METRICS.items():
        for m in metrics:
            ours, theirs = _figure(bench, framework, f"{task}-{m}"), results[task][f"{m},none"]
            ratio = "perplexity" in m or m == "bits_per_byte"
            if framework == "hf":
                close = math.isclose(ours, theirs, rel_tol=1e-6, abs_tol=0) if "perplexity" in m else \
                    math.isclose(ours, theirs, abs_tol=1e-6, rel_tol=0)
            else:   # a figure of loglikelihoods: 2%; a share of items: one flipped pick, at most
                close = math.isclose(ours, theirs, rel_tol=0.02) if ratio else abs(ours - theirs) <= 1 / 20 + 1e-9
            assert close, (framework, task, m, ours, theirs)


def test_the_native_choice_kind_gives_its_lm_eval_twins_numbers(bench):
    for fw in ("hf", "llamacpp", "vllm"):
        for task, m in [(t, m) for t in MC_TASKS for m in METRICS[t]]:
            native, twin = _rows(bench, fw, f"native-{task}-{m}"), _rows(bench, fw, f"{task}-{m}")
            assert list(native.prediction) == list(twin.prediction), (fw, task, m)
            assert list(native.score) == list(twin.score), (fw, task, m)
            assert np.allclose(np.stack(native.choice_logprobs), np.stack(twin.choice_logprobs), atol=1e-9, rtol=0)


def test_acc_norm_with_the_default_delimiter_is_lm_evals(reference, bench):
    """lm-eval's acc_norm divides by the choice without its target_delimiter: the native kind's picks equal
    lm-eval's own on every item, and the count of items the old divisor (one more character) would pick
    otherwise on this build of the model is printed (it depends on the model: 1 of 111 here)."""
    samples, results = reference
    rows = _rows(bench, "hf", "native-ref_delim_mc-acc_norm")
    lm_eval_picks, flipped = [], 0
    for s in samples["ref_delim_mc"]:
        lls, texts = np.array([x[0] for x in s["filtered_resps"]]), s["doc"]["choices"]
        assert not any(t.startswith(" ") for t in texts)   # the new form: choices without the delimiter
        pick = int(np.argmax(lls / [len(t) for t in texts]))
        assert s["acc_norm"] == float(pick == s["doc"]["answer_index"])   # lm-eval's own rule, as read here
        lm_eval_picks.append(pick)
        flipped += pick != int(np.argmax(lls / [len(t) + 1 for t in texts]))
    assert [int(p) for p in rows.prediction] == lm_eval_picks
    assert math.isclose(_figure(bench, "hf", "native-ref_delim_mc-acc_norm"), results["ref_delim_mc"]["acc_norm,none"],
                        abs_tol=1e-9)
    print(f"\nref_delim_mc: the old divisor (len(' ' + choice)) would pick otherwise on {flipped} of {len(rows)} items")


def test_prediction_is_the_pick_of_the_stored_metric(bench):
    for fw in ("hf", "llamacpp", "vllm"):
        for m in METRICS["ref_boundary_mc"]:
            rows = _rows(bench, fw, f"ref_boundary_mc-{m}")
            assert (rows.score == (rows.prediction.astype(int) == rows.target.astype(int)).astype(float)).all(), (fw, m)


def test_print_the_reference_table(reference, bench, capsys):
    table = _table(reference, bench)
    with capsys.disabled():
        print("\n" + table)
    assert table.count("\n") == 3 * sum(map(len, METRICS.values()))
