"""`bench gate --junit FILE`: the gate's checks as JUnit XML, one test case per rule and cell, so CI
systems show the result natively (a failed check is a <failure> with its message)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from orchestrator.judge.gate import Check
from orchestrator.store.run_store import atomic_write_text


# characters XML 1.0 cannot hold at all, even escaped (control characters but tab, LF, CR; U+FFFE, U+FFFF): a
# name from a matrix or an engine's message carrying one would make the whole file unreadable to a CI system
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")


def _xml(text: str) -> str:
    """Text ElementTree can write as XML a parser reads: & < > and quotes it escapes; what XML cannot hold is
    shown as U+FFFD."""
    return _NOT_XML.sub("\ufffd", str(text))


def write_junit(checks: list[Check], path: str | Path, suite: str = "lossless-bench gate") -> None:
    failures = sum(not c.passed for c in checks)
    root = ET.Element("testsuites", name=suite, tests=str(len(checks)), failures=str(failures))
    ts = ET.SubElement(root, "testsuite", name=suite, tests=str(len(checks)), failures=str(failures), errors="0",
                       skipped="0")
    for c in checks:
        case = ET.SubElement(ts, "testcase", classname=_xml(f"rule {c.rule}: {c.name}"),
                             name=_xml(f"{c.cell_id} {c.cell}" if c.cell_id else c.cell))
        if c.passed:
            ET.SubElement(case, "system-out").text = _xml(c.message)
        else:
            ET.SubElement(case, "failure", message=_xml(c.message[:500]), type="gate").text = _xml(c.message)
    ET.indent(root)
    atomic_write_text(Path(path), ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n")
