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
