"""The task layer: task sets in the matrix, run by real engines, stored per item, judged item by item.

One run of the built-in tasks and two lm-eval tasks (a local YAML + JSONL) through transformers,
llama.cpp (f32 and q4_0) and vLLM-CPU. (The metric and statistics definitions, checked by hand, and the
tasks section's validation: unit/test_task_stats.py.)
"""

import copy
import json
import os
import subprocess

import numpy as np
import pytest
import yaml
from scipy.stats import binomtest

from orchestrator.execution.runner import run_matrix
from orchestrator.judge.task_verdicts import analyse_tasks, summarize_tasks
from orchestrator.store.run_store import RunStore
from tests.helpers import BUILTIN_TASK_NAMES, ROOT, SMALL_MATRIX, bench_cmd

VLLM_PY = ROOT / ".venvs" / "vllm" / "bin" / "python"
LM_EVAL_DIR = ROOT / "tests" / "data" / "lm_eval"


# ------------------------------------------------------------------ real engines

@pytest.fixture(scope="module")
def task_run(ray_local, tmp_path_factory, tiny_model):
    assert VLLM_PY.exists(), f"vLLM environment missing ({VLLM_PY}): make env-vllm"
    data = copy.deepcopy(SMALL_MATRIX)
    data["axes"] = {"framework": ["hf", "llamacpp", "vllm"], "model": ["tiny"], "quantization": ["fp32"],
                    "batch_size": [1], "flags": ["default"], "input_len": [16], "output_len": [6]}
    # in_process: a load of 3-9 s, not 17-35 s (docs/engines.md); e2e/test_vllm.py keeps vLLM's child processes
    data["flags"] = {"vllm": {"default": {"enforce_eager": True, "cpu_kvcache_space_gib": 0.25, "in_process": True}}}
    data["include"] = [{"framework": "llamacpp", "quantization": "q4_0", "flags": "default"},
                       {"framework": "hf", "quantization": "fp32", "flags": "default", "batch_size": 4}]
    data["tasks"] = BUILTIN_TASK_NAMES + [
        {"kind": "lm_eval", "task": "tiny_mc", "include_path": str(LM_EVAL_DIR)},
        {"kind": "lm_eval", "task": "tiny_lastword_gen", "include_path": str(LM_EVAL_DIR)}]
    data["run"]["python"] = {"vllm": str(VLLM_PY)}
    data["run"]["cell_timeout_s"] = 600
    d = tmp_path_factory.mktemp("tasks")
    (d / "m.yaml").write_text(yaml.safe_dump(data))
    store = run_matrix(d / "m.yaml", d / "run")
    return store, store.read_cells(), RunStore(store.root).read_tasks().to_pandas(), analyse_tasks(store.root)


def _cell_id(cells, framework, quantization="fp32", batch=1):
    rows = cells[(cells.framework == framework) & (cells.quantization == quantization) & (cells.batch_size == batch)]
    assert len(rows) == 1
    return rows.cell_id.iloc[0]


def test_every_engine_runs_every_task_and_stores_each_item(task_run):
    _, cells, items, tv = task_run
    assert set(cells.status) == {"ok"}, cells[["framework", "quantization", "status", "reason"]]
    counts = items.groupby(["cell_id", "task"]).item_index.nunique().unstack()
    assert counts.shape == (5, 5) and not counts.isna().any().any(), counts
    assert (counts[BUILTIN_TASK_NAMES] == 111).all().all()
    assert (counts[["tiny_mc", "tiny_lastword_gen"]] == 20).all().all()
    hf = _cell_id(cells, "hf")
    acc = items[items.cell_id == hf].groupby("task").score.mean()
    # the built-in sets are hard enough for the tiny model to move: well away from 0 and 1
    assert 0.2 < acc["tiny-lastword"] < 0.9 and 0.2 < acc["tiny-ending"] < 0.9, acc
    assert set(tv.task_verdict) <= {"no change", "not distinguishable", "improved", "regressed"}, tv[["task", "task_reason"]]


def test_fp32_engines_agree_with_transformers_on_every_task(task_run):
    _, cells, items, tv = task_run
    for fw in ("vllm", "llamacpp"):
        rows = tv[tv.cell_id == _cell_id(cells, fw)]
        assert len(rows) == 5 and (rows.task_verdict == "no change").all(), rows[["task", "task_reason"]]
    batch4 = tv[tv.cell_id == _cell_id(cells, "hf", batch=4)]
    assert (batch4.task_verdict == "no change").all()


def test_q4_0_moves_items_and_the_verdict_is_the_tests(task_run):
    """q4_0 changes some items; whatever the verdict, it is McNemar's on the stored items."""
    _, cells, items, tv = task_run
    base, q4 = _cell_id(cells, "hf"), _cell_id(cells, "llamacpp", "q4_0")
    moved = 0
    for task in ("tiny-lastword", "tiny-ending"):
        a = items[(items.cell_id == base) & (items.task == task)].set_index("item_index").score.sort_index()
        b = items[(items.cell_id == q4) & (items.task == task)].set_index("item_index").score.sort_index()
        worse, better = int(((a == 1) & (b == 0)).sum()), int(((a == 0) & (b == 1)).sum())
        moved += worse + better
        row = tv[(tv.cell_id == q4) & (tv.task == task)].iloc[0]
        p = 1.0 if worse + better == 0 else binomtest(better, worse + better).pvalue
        assert (row.worse, row.better) == (worse, better) and row.p_value == pytest.approx(p)
        # inside the noise: 'no change' only where the test could have seen a 2% change (task_tolerance)
        quiet = "no change" if row.mde_rel <= 0.02 else "not distinguishable"
        assert row.task_verdict == (quiet if p >= 0.05 else "regressed" if worse > better else "improved")
        assert row.test == "mcnemar-exact" and f"p={p:.3g}" in row.task_reason
    preds = items[items.task == "tiny-continue"].pivot(index="item_index", columns="cell_id", values="prediction")
    assert moved > 0 or (preds[base] != preds[q4]).any()


def _choice_logprobs_by_hand(model_dir, prompt: str, choices: list[str]) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM

    from adapters.contract.tokenizer import Tokenizer

    tok = Tokenizer(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ctx = tok.encode(prompt)
    out = []
    for c in choices:
        cont = tok.encode(prompt + c)[len(ctx):]
        with torch.no_grad():
            lp = model(torch.tensor([ctx + cont])).logits[0].log_softmax(-1).double()
        out.append(float(sum(lp[len(ctx) - 1 + i, t] for i, t in enumerate(cont))))
    return out


def test_a_choice_item_scored_by_hand_gets_the_adapters_answer(task_run, tiny_model):
    _, cells, items, _ = task_run
    item = json.loads((ROOT / "orchestrator/inputs/data/tasks/tiny-ending.jsonl").read_text().splitlines()[0])
    # the task's target_delimiter (" ") joins prompt and choice, as lm-eval's multiple choice joins them
    mine = _choice_logprobs_by_hand(tiny_model, item["prompt"], [" " + c for c in item["choices"]])
    # llama.cpp keeps its KV cache in f16 by default: ~3e-4 per token off an fp32 reference, summed
    for fw, atol in (("hf", 1e-5), ("vllm", 1e-3), ("llamacpp", 2e-2)):
        row = items[(items.cell_id == _cell_id(cells, fw)) & (items.task == "tiny-ending") & (items.item_index == 0)].iloc[0]
        assert np.allclose(row.choice_logprobs, mine, atol=atol), (fw, row.choice_logprobs, mine)
        assert int(row.prediction) == int(np.argmax(mine))
        assert row.score == float(np.argmax(mine) == item["answer_index"])
    # lm-eval's multiple choice over the same adapter scores the same ids: the same loglikelihoods
    hf = items[(items.cell_id == _cell_id(cells, "hf")) & (items.task == "tiny_mc") & (items.item_index == 0)].iloc[0]
    assert np.allclose(hf.choice_logprobs, mine, atol=1e-4)
    assert hf.score == float(np.argmax(mine) == item["answer_index"])


def test_an_lm_eval_generation_item_scored_by_hand(task_run):
    _, cells, items, _ = task_run
    answers = [json.loads(x)["answer"] for x in (LM_EVAL_DIR / "tiny_lastword.jsonl").read_text().splitlines()]
    for fw in ("hf", "vllm", "llamacpp"):
        rows = items[(items.cell_id == _cell_id(cells, fw)) & (items.task == "tiny_lastword_gen")]
        assert set(rows.metric) == {"exact_match"}
        for r in rows.itertuples():
            # exact_match with ignore_case and ignore_punctuation, after the YAML's remove_whitespace filter
            strip = str.maketrans("", "", "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
            by_hand = float(r.prediction.lower().translate(strip) == answers[r.item_index].lower().translate(strip))
            assert r.score == by_hand and r.target == answers[r.item_index]
    hf = items[(items.cell_id == _cell_id(cells, "hf")) & (items.task == "tiny_lastword_gen")].set_index("item_index")
    ours = items[(items.cell_id == _cell_id(cells, "hf")) & (items.task == "tiny-lastword")].set_index("item_index")
    assert hf.score.mean() > 0.2                    # the same items through lm-eval and our own runner
    assert (hf.prediction.str.split().str[0] == ours.prediction.reindex(hf.index).str.split().str[0]).all()


def test_compare_prints_the_task_layer(task_run):
    store, *_ = task_run
    r = subprocess.run(bench_cmd("compare", str(store.root), "--wide"), cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "COLUMNS": "250"})
    assert r.returncode == 0, r.stderr
    assert "Task layer" in r.stdout and "McNemar exact" in r.stdout and "paired bootstrap" in r.stdout
    assert "tiny_mc" in r.stdout and "no change" in r.stdout


def test_gate_on_task_rules(task_run, tmp_path):
    store, cells, _, tv = task_run
    summary = summarize_tasks(tv).set_index("cell_id")
    assert summary.loc[_cell_id(cells, "vllm"), "task_verdict"] == "no change"
    met = tmp_path / "met.yaml"
    met.write_text(yaml.safe_dump({"rules": [
        {"match": {"framework": ["vllm", "llamacpp"], "quantization": "fp32"},
         "task": {"name": "tiny-ending", "min_ratio": 0.99, "no_regression": True}}]}))
    violated = tmp_path / "violated.yaml"
    violated.write_text(yaml.safe_dump({"rules": [   # a ratio of 1.0 [1.0, 1.0] is wholly below 1.5
        {"match": {"framework": "vllm"}, "task": {"name": "tiny-lastword", "min_ratio": 1.5}}]}))
    unknown = tmp_path / "unknown.yaml"     # a task the run did not run: a mistake in the policy, not a cell
    unknown.write_text(yaml.safe_dump({"rules": [
        {"match": {"framework": "vllm"}, "task": {"name": "no-such-task", "min_ratio": 0.99}}]}))
    ok = subprocess.run(bench_cmd("gate", str(store.root), "--policy", str(met)), cwd=ROOT, capture_output=True,
                        text=True, timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run(bench_cmd("gate", str(store.root), "--policy", str(violated)), cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "ratio x1.0000 [95% CI 1.0000, 1.0000] wholly below x1.5" in bad.stdout
    typo = subprocess.run(bench_cmd("gate", str(store.root), "--policy", str(unknown)), cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "300"})
    assert typo.returncode == 2, typo.stdout + typo.stderr
    assert "rules[0].task.name: the run has no task 'no-such-task' (it has: " in typo.stderr, typo.stderr
    empty = tmp_path / "empty.yaml"
    empty.write_text(yaml.safe_dump({"rules": [{"match": {"framework": "vllm"}, "task": {"name": "tiny-ending"}}]}))
    usage = subprocess.run(bench_cmd("gate", str(store.root), "--policy", str(empty)), cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert usage.returncode == 2 and "min_ratio or no_regression" in usage.stdout + usage.stderr


def test_a_task_that_cannot_run_is_a_null_with_its_reason(ray_local, tmp_path, tiny_model):
    """An lm-eval task whose data file is missing (validate cannot see that: lm-eval reads its own data):
    the cell stays ok (its timings are real), the task is n/a with lm-eval's own error, and no rows are
    stored for it."""
    data = copy.deepcopy(SMALL_MATRIX)
    data["axes"]["batch_size"] = [1]
    data["tasks"] = ["tiny-ending", {"kind": "lm_eval", "task": "tiny_no_data", "include_path": str(LM_EVAL_DIR)}]
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(data))
    store = run_matrix(tmp_path / "m.yaml", tmp_path / "run")
    cells = store.read_cells()
    assert list(cells.status) == ["ok"]
    missing = json.loads(cells.missing.iloc[0])
    assert "no_such_file.jsonl" in missing["task:tiny_no_data"], missing
    tv = analyse_tasks(store.root)
    row = tv[tv.task == "tiny_no_data"].iloc[0]
    assert row.task_verdict == "n/a" and row.task_reason.startswith("not run: ")
    assert set(RunStore(store.root).read_tasks().to_pandas().task) == {"tiny-ending"}


def test_validate_refuses_an_unknown_lm_eval_task_before_any_engine_starts(tmp_path):
    data = copy.deepcopy(SMALL_MATRIX)
    data["tasks"] = [{"kind": "lm_eval", "task": "no_such_lm_eval_task", "include_path": str(LM_EVAL_DIR)},
                     {"kind": "lm_eval", "task": "tiny_mc", "metric": "f1", "include_path": str(LM_EVAL_DIR)}]
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(data))
    r = subprocess.run(bench_cmd("run", str(tmp_path / "m.yaml"), "--run-dir", str(tmp_path / "run")), cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "tasks[0].task: lm-eval has no task 'no_such_lm_eval_task'" in r.stdout + r.stderr
    assert "tasks[1].metric: lm-eval task tiny_mc has no metric 'f1' (it has: acc, acc_norm)" in r.stdout + r.stderr
    assert not (tmp_path / "run").exists()
