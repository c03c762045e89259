"""What `bench run` ends with (orchestrator/report/run_summary.py): the verdicts, not only the speed table. Read
from the golden stored run (tests/data/golden/runs/new: hf fp32 baseline, three llama.cpp cells, one unsupported)."""

from orchestrator.judge.verdicts import judge_run
from orchestrator.report.run_summary import fastest_unchanged, summary_lines
from tests.helpers import ROOT

RUN = ROOT / "tests" / "data" / "golden" / "runs" / "new"


def test_the_first_screen_answers_both_questions():
    v = judge_run(RUN)
    lines = summary_lines(v, "RUN")
    assert lines[0] == "verdicts (5 cells, 4 ran):"
    assert lines[1] == "  logits and text: 1 identical, 1 lossless, 2 near-lossless, 1 n/a"
    assert any(line.startswith("  tasks (2 task(s)") for line in lines)
    # the fastest cell whose outputs did not change: lossless f32_kv, not the faster but near-lossless q8_0
    best = fastest_unchanged(v.cells)
    assert (best["flags"], best["quantization"], best["verdict"]) == ("f32_kv", "fp32", "lossless")
    fastest = next(line for line in lines if line.startswith("fastest with outputs unchanged:"))
    assert "llamacpp/tiny/fp32/f32_kv batch 1 (lossless): 11.92x [9.41, 15.1] q=2.5e-05 faster" in fastest
    assert any(line.startswith("did not run: llamacpp/tiny/fp8/default batch 1: unsupported") for line in lines)
    assert lines[-1] == "further: bench compare RUN (every layer; --wide), bench report RUN (report.html)"


def test_no_unchanged_cell_is_said_so():
    v = judge_run(RUN)
    cells = v.cells.assign(verdict=["identical", "lossy", "near-lossless", "n/a", "lossy"])
    assert fastest_unchanged(cells) is None
