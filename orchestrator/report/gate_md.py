"""`bench gate --format md`: the gate's checks as a Markdown summary fit for a pull-request comment."""

from __future__ import annotations

from orchestrator.judge.gate import Check
from orchestrator.values import md_inert


def _cell(text: str) -> str:
    return md_inert(text).replace("|", "\\|").replace("\n", " ")


def gate_markdown(checks: list[Check], title: str) -> str:
    failed = [c for c in checks if not c.passed]
    head = f"### {title}: {'FAIL' if failed else 'pass'}"
    out = [head, "", f"{len(checks)} check(s), {len(failed)} failed. A speed bound fails only when the 95% interval "
           "of the change lies wholly beyond it: noise alone never fails.", ""]
    shown = failed + [c for c in checks if c.passed]
    if shown:
        out += ["| | rule | cell | result |", "|---|---|---|---|"]
        out += [f"| {'❌' if not c.passed else '✅'} | {c.rule}: {_cell(c.name)} | {_cell(c.cell)} | "
                f"{_cell(c.message[:300])} |" for c in shown]
    return "\n".join(out) + "\n"
