"""The task layer by hand: the generation metrics and the paired statistics (McNemar's exact test, Wilson's
interval, false alarms at the stated level), and the matrix's tasks section (the built-in task files parse;
bad entries name their path). (Tasks run by real engines: e2e/test_tasks.py.)"""

import math

import numpy as np
import pytest
from scipy.stats import binomtest

from orchestrator.inputs.task_metrics import generation_score, normalize, token_f1
from orchestrator.inputs.task_sets import BUILTIN_TASKS, GenerationTask, read_items
from orchestrator.judge.task_stats import paired_change, score_interval
from orchestrator.matrix.models import MatrixError
from orchestrator.matrix.validate import parse_matrix
from tests.helpers import BUILTIN_TASK_NAMES

# ------------------------------------------------------------------ metrics and statistics by hand

def _gen(metric: str, **kw) -> GenerationTask:
    return GenerationTask(kind="generation", name="t", path="x", metric=metric, **kw)


def test_generation_metrics_by_hand():
    assert normalize("  The Cat, sat!  ") == "cat sat"
    assert generation_score(_gen("exact_match"), " the cat.", ["Cat"]) == 1.0
    assert generation_score(_gen("exact_match"), "a dog", ["cat", "dog"]) == 1.0      # the best answer counts
    assert generation_score(_gen("contains"), "it was a cat today", ["cat"]) == 1.0
    gsm = _gen("regex_match", regex=r"-?\d+", regex_pick="last")
    assert generation_score(gsm, "3 + 4 = 7, so 12", ["12"]) == 1.0
    assert generation_score(gsm, "3 + 4 = 12, so 7", ["12"]) == 0.0
    assert generation_score(_gen("regex_match", regex=r"\w+", regex_pick="first"), " town and", ["town"]) == 1.0
    # SQuAD F1: 2 of 3 predicted tokens in the 2-token answer: p 2/3, r 1, F1 0.8
    assert token_f1("big red dog", "red dog") == pytest.approx(0.8)
    # ROUGE-L: LCS 2 of 3 and 2 of 4 tokens: p 2/3 (pred), r 2/4: F 4/7
    assert generation_score(_gen("rouge_l"), "red big dog", ["the big red dog"]) == pytest.approx(4 / 7)
    assert generation_score(_gen("chrf"), "same words", ["same words"]) == pytest.approx(1.0)
    assert generation_score(_gen("bleu"), "the cat sat on the mat", ["the cat sat on the mat"]) == pytest.approx(1.0)
    assert generation_score(_gen("bleu"), "x", ["the cat sat on the mat"]) == 0.0


def test_paired_statistics_by_hand():
    base = np.array([1.0] * 60 + [0.0] * 51)
    cell = base.copy()
    cell[:8] = 0.0                                   # 8 right -> wrong, none the other way
    c = paired_change(base, cell, binary=True)
    assert (c.worse, c.better, c.n_paired) == (8, 0, 111)
    assert c.p_value == pytest.approx(2 * 0.5 ** 8)  # McNemar exact: two-sided binomial, 8 of 8 discordant
    assert c.verdict == "regressed" and c.change == pytest.approx(-8 / 111)
    assert c.change_lo < c.change < c.change_hi < 0
    assert c.ratio == pytest.approx(52 / 60) and c.ratio_hi < 1
    few = cell.copy()
    few[:8] = 1.0
    few[:3] = 0.0                                    # 3 discordant: p = 0.25, inside the noise
    # ... but 111 items with 3 flips cannot see a 2% change: SE ~ sqrt(3)/111, MDE ~ 2.8 SE ~ 8% of 0.54
    weak = paired_change(base, few, binary=True)
    assert weak.verdict == "not distinguishable" and weak.p_value == pytest.approx(0.25)
    assert 0.05 < weak.mde_rel < 0.12 and weak.items_needed > 1000
    assert paired_change(base, few, binary=True, tolerance=0.15).verdict == "no change"
    same = paired_change(base, base, binary=True)
    assert (same.p_value, same.verdict, same.change_lo, same.change_hi, same.mde) == (1.0, "no change", 0.0, 0.0, 0.0)
    # continuous: a shift of every item is found, noise around 0 is not
    rng = np.random.default_rng(1)
    a = rng.uniform(0, 1, 200)
    assert paired_change(a, a - 0.05, binary=False).verdict == "regressed"
    noisy = paired_change(a, a + rng.normal(0, 0.01, 200), binary=False)
    assert noisy.verdict == "no change"
    # the smallest visible change: (z(0.975) + z(0.8)) x SE of the mean difference, SE = 0.01 / sqrt(200)
    assert noisy.mde == pytest.approx(2.8016 * 0.01 / math.sqrt(200), rel=0.1)
    lo, hi = score_interval(base, binary=True)      # Wilson's interval
    ci = binomtest(60, 111).proportion_ci(0.95, method="wilson")
    assert (lo, hi) == (pytest.approx(ci.low), pytest.approx(ci.high)) and lo < 60 / 111 < hi


def test_false_alarms_at_the_stated_level():
    """Two cells that differ only by chance (items flip both ways alike): 'regressed' or 'improved'
    about alpha of the time, never more than the binomial spread of 400 tries allows."""
    rng = np.random.default_rng(0)
    alarms = 0
    for _ in range(400):
        base = (rng.uniform(size=111) < 0.5).astype(float)
        flip = rng.uniform(size=111) < 0.1
        alarms += paired_change(base, np.where(flip, 1 - base, base), binary=True, n_boot=200).verdict in (
            "regressed", "improved")
    assert alarms / 400 <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 400)


# ------------------------------------------------------------------ the matrix's tasks section

def test_builtin_task_files_parse_and_bad_entries_name_their_path(tmp_path):
    for name in BUILTIN_TASK_NAMES:
        assert len(read_items(BUILTIN_TASKS[name]).prompts) == 111
    bad_line = tmp_path / "bad.jsonl"
    bad_line.write_text('{"prompt": "a", "answer": "b"}\n{"prompt": "c"}\n')
    base = {"models": {"t": "builtin:tiny"}, "axes": {"framework": ["hf"], "model": ["t"]}}
    with pytest.raises(MatrixError) as err:
        parse_matrix(base | {"tasks": [
            "tiny-nope",
            {"kind": "generation", "name": "a", "path": str(tmp_path / "missing.jsonl")},
            {"kind": "generation", "name": "b", "path": str(bad_line)},
            {"kind": "generation", "name": "c", "path": str(bad_line), "metric": "regex_match"},
            {"kind": "choice", "name": "tiny-ending", "path": str(bad_line)},
            "tiny-ending",
            {"kind": "lm_eval", "task": "x", "include_path": str(tmp_path / "none")}]})
    text = str(err.value)
    assert "tasks[0]: unknown built-in task 'tiny-nope' (known: tiny-lastword, tiny-continue, tiny-ending" in text
    assert f"tasks[1].path: no such file: {tmp_path / 'missing.jsonl'}" in text
    assert f"tasks[2].path: line 2 of {bad_line}: expected 'answer'" in text
    assert "tasks[3].regex: regex_match needs a pattern" in text
    assert f"tasks[4].path: line 1 of {bad_line}: expected 'choices'" in text
    assert "tasks[5]: a second task named 'tiny-ending' (tasks[4])" in text
    assert "tasks[6].include_path: no such folder" in text
