"""Markdown a viewer renders (report.md, the gate's summary for a pull-request comment) carries no raw
HTML: text from a matrix or an engine (a cell label, a message) is HTML escaped."""

from orchestrator.judge.gate import Check
from orchestrator.report.gate_md import gate_markdown

PAYLOAD = "<script>alert(1)</script>|x"


def test_gate_markdown_escapes_html():
    out = gate_markdown([Check(rule=1, name="must_be lossless", cell=PAYLOAD, cell_id=None, passed=False,
                               message=PAYLOAD)], "gate")
    assert "<script>" not in out
    assert "&lt;script>alert(1)&lt;/script>\\|x" in out


HOSTILE = "<script>alert(1)</script> & ]]> \x00\x1b\x7f `tick` \ufffe"


def test_junit_with_hostile_names_parses_and_holds_them_as_text(tmp_path):
    import xml.etree.ElementTree as ET

    from orchestrator.report.gate_junit import write_junit
    checks = [Check(rule=1, name=f"must_be lossless {HOSTILE}", cell=HOSTILE, cell_id="abc", passed=False,
                    message=HOSTILE),
              Check(rule=2, name="max_slowdown", cell=HOSTILE, cell_id=None, passed=True, message=HOSTILE)]
    write_junit(checks, tmp_path / "g.xml")
    root = ET.parse(tmp_path / "g.xml").getroot()   # a parser reads it: no control character made it invalid
    cases = root.findall("./testsuite/testcase")
    assert len(cases) == 2 and root.get("failures") == "1"
    failure = cases[0].find("failure")
    assert failure.text.startswith("<script>alert(1)</script> & ]]> ") and "`tick`" in failure.text   # as text
    assert "\x00" not in failure.text and "\ufffd" in failure.text
    assert cases[1].find("system-out").text.startswith("<script>")
    assert "<script>" not in (tmp_path / "g.xml").read_text()   # escaped in the file


def test_markdown_pages_carry_no_raw_html_but_keep_code_spans_as_written():
    from orchestrator.values import md_page_inert
    page = f"## run <b>x</b>\n| {HOSTILE} |\nMatrix `a<b & c` p<0.05\n"
    out = md_page_inert(page)
    assert "<b>" not in out and "<script>" not in out and "&lt;script>" in out and "p&lt;0.05" in out
    assert "`a<b & c`" in out   # a code span shows its text as it is: no entity there


def test_compare_md_of_a_run_with_hostile_names_is_inert(tmp_path, monkeypatch):
    import pandas as pd

    from orchestrator.report.compact import compare_compact, render
    row = {"framework": "hf", "model": "<img src=x onerror=alert(1)>", "quantization": "fp32",
           "flags": "<script>x</script>", "batch_size": 1, "verdict": "lossy",
           "verdict_reason": "kl_mean 1 > kl_near 0.01 <iframe>", "speedup": 1.0, "speedup_lo": 0.9, "speedup_hi": 1.1}
    md = render("md", {"cells": pd.DataFrame([row])}, [compare_compact(pd.DataFrame([row, {**row, "flags": "b"}]))])
    assert "<script>" not in md and "<img" not in md and "<iframe>" not in md
    assert "&lt;script>x&lt;/script>" in md
