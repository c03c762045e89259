"""Where a cell's layers disagree, one line says how both can be true (orchestrator/judge/reconcile.py),
in `bench compare` and in the report."""

import shutil

import pandas as pd
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.judge.analysis import analyse
from orchestrator.judge.sampling_verdicts import analyse_sampling
from orchestrator.judge.task_verdicts import analyse_tasks
from orchestrator.report import console
from orchestrator.judge.reconcile import reconcile
from orchestrator.report.write import write_report
from tests.helpers import ROOT

RUN = ROOT / "tests" / "data" / "golden" / "runs" / "new"


def test_logits_moved_while_no_task_item_flipped():
    df, tv, sv = analyse(RUN), analyse_tasks(RUN), analyse_sampling(RUN)
    found = reconcile(df, tv, sv)
    by = {(r["quantization"], r["flags"]): r["cell_id"] for r in df.to_dict("records")}
    # near-lossless and lossy cells whose every task says no change; not the baseline, not the lossless cell
    assert set(found) == {by["fp32", "default"], by["q8_0", "default"]}
    q8 = found[by["q8_0", "default"]]
    assert q8.startswith("logits moved (KL 2.8e-4, near-lossless) but no greedy token changed and no task item flipped "
                         "at n=111 (tiny-ending, tiny-lastword)")
    # no item moved, so the power formula has nothing to go on: what McNemar's exact test could not see, at the
    # task family's level (6 tests, none called: 0.05 / 6; the baseline against itself is no test)
    assert "could miss a drop of up to 7 items (6.3%; McNemar needs 8 one way at p<0.00833, the task family's level)" \
        in q8
    assert "KL 1.4e-7, near-lossless" in found[by["fp32", "default"]]


def _cell(verdict: str, **kw) -> dict:
    return {"cell_id": "c", "baseline_cell_id": "b", "framework": "vllm", "model": "m", "quantization": "fp8",
            "flags": "default", "verdict": verdict, "kl_mean": 3e-2, "greedy_match": 0.5} | kw


def _task(verdict: str, **kw) -> dict:
    return {"cell_id": "c", "task": "gsm8k", "metric": "exact_match", "task_verdict": verdict, "n_paired": 200,
            "worse": 0, "better": 0, "mde": 0.05, "mde_rel": 0.1, "test": "mcnemar-exact", "change": 0.0,
            "change_lo": -0.02, "change_hi": 0.02} | kw


def test_each_kind_of_disagreement_and_agreement():
    lossy = pd.DataFrame([_cell("lossy")])
    # items flipped both ways, within chance; the power the task layer computed bounds what it could miss
    line = reconcile(lossy, pd.DataFrame([_task("no change", worse=3, better=2)]))["c"]
    assert line == ("logits moved (KL 0.03, lossy); 5 task item(s) flipped at n=200 (gsm8k), within chance: no paired "
                    "test finds a change, which could miss a drop under 0.05 (10.0% of the baseline's exact_match) "
                    "on gsm8k")
    # the layers agree: logits moved and a task regressed; logits lossless and the tasks unmoved
    assert reconcile(lossy, pd.DataFrame([_task("regressed", change=-0.1)])) == {}
    assert reconcile(pd.DataFrame([_cell("lossless")]), pd.DataFrame([_task("no change")])) == {}
    # lossless logits, a regressed task
    moved = reconcile(pd.DataFrame([_cell("lossless")]), pd.DataFrame([_task("regressed", change=-0.1, change_lo=-0.15,
                                                                                change_hi=-0.05)]))["c"]
    assert moved.startswith("logits lossless but gsm8k regressed (exact_match -0.1 [-0.15, -0.05])")
    # identical logits, samples that differ
    sv = pd.DataFrame([{"cell_id": "c", "sampling_verdict": "different", "dist_p": 1e-4}])
    assert reconcile(pd.DataFrame([_cell("identical")]), None, sv)["c"].startswith(
        "logits identical but the seeded samples differ (p=0.0001)")
    # the baseline against itself says nothing
    assert reconcile(pd.DataFrame([_cell("lossy", baseline_cell_id="c")]), pd.DataFrame([_task("no change")])) == {}


def test_compare_and_the_report_print_the_line(tmp_path, monkeypatch):
    shutil.copytree(RUN, tmp_path / "new")
    monkeypatch.setattr(console.out, "_width", 120)
    res = CliRunner().invoke(app, ["compare", str(tmp_path / "new")], catch_exceptions=False)
    text = " ".join(res.stdout.split())
    assert "layers disagree: llamacpp/tiny/fp32/default: logits moved (KL 1.4e-7, near-lossless)" in text
    assert "llamacpp/tiny/q8_0/default: logits moved (KL 2.8e-4, near-lossless) but no greedy token changed" in text
    html, md = write_report(tmp_path / "new", tmp_path / "out" / "report.html")
    assert "Where the layers disagree" in html.read_text() and "no task item flipped at n=111" in html.read_text()
    assert "- llamacpp/tiny/q8_0/default batch 1: logits moved (KL 2.8e-4, near-lossless)" in md.read_text()


def test_cells_that_differ_by_batch_alone_are_named_apart():
    """`layers disagree` once printed `llamacpp/tiny/fp32/default` twice: batch 1 and 4 shared the label."""
    from orchestrator.judge.reconcile import disagree_lines

    cells = pd.DataFrame([_cell("lossy", cell_id=c, batch_size=b, mode="offline", input_len=16, output_len=8)
                          for c, b in (("c1", 1), ("c4", 4))]
                         + [_cell("lossy", cell_id="q", quantization="q4_0", batch_size=1, mode="offline")])
    lines = disagree_lines(cells, {"c1": "one", "c4": "four", "q": "other"})
    assert lines[0] == "layers disagree:"
    names = [line.split(": ")[0].strip() for line in lines[1:]]
    assert len(set(names)) == 3, names
    assert names[0].startswith("vllm/m/fp8/default ") and names[0] != "vllm/m/fp8/default"
    assert names[2] == "vllm/m/q4_0/default"   # no twin: no batch said
