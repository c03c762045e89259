"""The report's Pareto front, either way round, and its task layer against an older run, on runs made by
hand: written and read here, with no engine and no browser. (On a real run and in Chromium:
e2e/test_report.py.)"""

from pathlib import Path

import numpy as np
import pytest

from orchestrator.report.data import pareto_front
from orchestrator.report.write import write_report
from tests.helpers import QA_FLIPPED, QA_RIGHT, TASK_ITEMS, html_table, md_table, task_run_by_hand


@pytest.fixture(scope="module")
def task_run(tmp_path_factory) -> Path:
    return task_run_by_hand(tmp_path_factory.mktemp("tasks") / "new", QA_FLIPPED)


def test_pareto_front():
    speed = np.array([1.0, 2.0, 3.0, 3.0, 0.5, 2.0, 4.0])
    kl = np.array([0.0, 1e-6, 1e-3, 1e-2, 0.0, 1e-6, 1e-3])
    # 1 (0): not beaten; 2 (1e-6) and its twin: on; 3 (1e-3) beaten by 4 (1e-3); 3 (1e-2) beaten;
    # 0.5 (0) beaten by 1 (0); 4 (1e-3): on
    assert pareto_front(speed, kl).tolist() == [True, True, False, False, False, True, True]


def test_pareto_front_either_direction():
    speed = np.array([1.0, 1.5, 3.0, 2.0])
    score = np.array([0.60, 0.60, 0.42, 0.40])
    # a task score, higher is better: 1x is beaten by 1.5x (same score, faster); 2x by 3x (faster, better)
    assert pareto_front(speed, score, higher_is_better=True).tolist() == [False, True, True, False]
    # read as a KL (lower is better) the same numbers give another frontier: 2x (the lowest) and 3x (the fastest)
    assert pareto_front(speed, score).tolist() == [False, False, True, True]


def test_report_task_layer_against(task_run, tmp_path):
    """NEW against an OLD whose q4_0 cell got every qa item the baseline did: per task each NEW cell
    against its partner in OLD, q4_0 regressed; the against table carries the task verdict."""
    old = task_run_by_hand(tmp_path / "old", 0)
    html_path, md_path = write_report(task_run, tmp_path / "vs.html", against=old)
    text, md = html_path.read_text(), md_path.read_text()
    assert '<h3 id="tasks-against">Tasks against old</h3>' in text
    qa = html_table(text, "vs-task-0")
    assert qa[0]["vs-task-0-config"][1] == "vllm/tiny/q4_0/default" and qa[0]["vs-task-0-verdict"][1] == "regressed"
    assert qa[0]["vs-task-0-base"][1] == f"{QA_RIGHT / TASK_ITEMS:.3f}"   # OLD's q4_0 score
    assert sorted(r["vs-tasks"][1] for r in html_table(text, "against-cells")) == ["no change", "no change", "regressed"]
    assert "### Tasks against old" in md
    assert len(md_table(md, "### Tasks against old")) == 6
    # the in-run panel is still there
    assert html_table(text, "task-0")[0]["task-0-verdict"][1] == "regressed"

