"""`bench gate --junit FILE`: the gate's checks as JUnit XML, one test case per rule and cell, so CI
systems show the result natively (a failed check is a <failure> with its message)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from orchestrator.judge.gate import Check
from orchestrator.store.run_store import atomic_write_text


def write_junit(checks: list[Check], path: str | Path, suite: str = "lossless-bench gate") -> None:
    failures = sum(not c.passed for c in checks)
    root = ET.Element("testsuites", name=suite, tests=str(len(checks)), failures=str(failures))
    ts = ET.SubElement(root, "testsuite", name=suite, tests=str(len(checks)), failures=str(failures), errors="0",
                       skipped="0")
    for c in checks:
        case = ET.SubElement(ts, "testcase", classname=f"rule {c.rule}: {c.name}",
                             name=f"{c.cell_id} {c.cell}" if c.cell_id else c.cell)
        if c.passed:
            ET.SubElement(case, "system-out").text = c.message
        else:
            ET.SubElement(case, "failure", message=c.message[:500], type="gate").text = c.message
    ET.indent(root)
    atomic_write_text(Path(path), ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n")
