"""The docs a newcomer reads stay true to the repository: the README stays short and names no module
path; every relative link in the Markdown resolves to a file (and, for `#anchor`, to a heading, by
GitHub's slug rules); every `orchestrator/...` or `adapters/...` path the docs mention exists; the
README's cheat sheet lists every command of the real `bench` app, once each, and nothing else; and
every `bench <command>` written as code in the README and docs/ is a real command. Each check also
runs on planted text that breaks it, so none can pass by checking nothing. Reads files only: no
engine, no Ray, no subprocess."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_README_LINES = 210
MAX_LINE = 120            # README prose and tables; code blocks may run wider (a pasted terminal table)
CHEAT_SHEET = "Commands"  # the README section that lists every command, one line each


def _md(*parts: str) -> list[Path]:
    out = []
    for part in parts:
        p = ROOT / part
        out.extend(sorted(p.rglob("*.md")) if p.is_dir() else [p] if p.exists() else [])
    return out


LINKED = _md("README.md", "docs", "benchmarks", "results/README.md", "cluster/README.md")
PATHS = _md("README.md", "docs", "benchmarks", "results/README.md", "cluster/README.md")
CODE_COMMANDS = _md("README.md", "docs")


# ------------------------------------------------------------------ reading Markdown

FENCE = re.compile(r"^\s*(```|~~~)")


def split_fences(text: str) -> list[tuple[bool, str]]:
    """(in a fenced code block, line) for every line."""
    out, fence = [], None
    for line in text.splitlines():
        m = FENCE.match(line)
        if m and (fence is None or m.group(1) == fence):
            fence = m.group(1) if fence is None else None
            out.append((True, line))
        else:
            out.append((fence is not None, line))
    return out


def prose(text: str) -> list[tuple[int, str]]:
    """(line number, line with inline code removed) outside fenced code blocks."""
    return [(i, re.sub(r"`[^`]*`", "", line)) for i, (code, line) in enumerate(split_fences(text), 1) if not code]


def code_spans(text: str) -> list[str]:
    """Every fenced code line and every inline code span."""
    out = []
    for code, line in split_fences(text):
        if code:
            out.append(line)
        else:
            out.extend(re.findall(r"`([^`]+)`", line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text lower-cased, punctuation but '-' and '_'
    dropped, each space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)       # links and images: their text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"(\*\*|__|\*)", "", text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a Markdown file's headings; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for code, line in split_fences(text):
        m = None if code else re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        s = slug(m.group(1))
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")


def links(text: str) -> list[tuple[int, str]]:
    out = []
    for i, line in prose(text):
        out.extend((i, m.group(1)) for m in LINK.finditer(line))
        m = REF_DEF.match(line)
        if m:
            out.append((i, m.group(1)))
    return out


def broken_links(path: Path, text: str | None = None) -> list[str]:
    """Every relative link of a Markdown file that resolves to nothing, or to a missing heading."""
    text = path.read_text() if text is None else text
    out = []
    for line, target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):   # http:, https:, mailto: ...
            continue
        file, _, anchor = target.partition("#")
        file = file.split("?")[0]
        dest = (path.parent / file).resolve() if file else path
        where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{line}: {target}"
        if not dest.exists():
            out.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md":
            heads = anchors(text if dest == path else dest.read_text())
            if anchor not in heads:
                out.append(f"{where}: no heading #{anchor} in {dest.name}")
    return out


MODULE_PATH = re.compile(r"(?<![\w./-])((?:orchestrator|adapters)/[\w./*-]*)")


def missing_paths(text: str, root: Path = ROOT) -> list[str]:
    """Every orchestrator/... or adapters/... path the text mentions (prose or code) that does not exist."""
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        for m in MODULE_PATH.finditer(line):
            p = m.group(1).rstrip(".,;:")
            found = any(root.glob(p)) if "*" in p else (root / p).exists()
            if not found:
                out.append(f"{i}: {p}")
    return out


# ------------------------------------------------------------------ the app's commands

def app_commands() -> set[str]:
    """Every command of `bench`, a sub-app's as 'model tiny'."""
    from orchestrator.cli import app

    group = typer.main.get_command(app)
    out = set()
    for name, cmd in group.commands.items():
        subs = getattr(cmd, "commands", None)   # a sub-app (typer's group: typer ships its own click)
        if subs:
            out.update(f"{name} {sub}" for sub in subs)
        else:
            out.add(name)
    return out


def app_groups() -> set[str]:
    return {c.split()[0] for c in app_commands() if " " in c}


def bench_command(words: list[str], groups: set[str]) -> str | None:
    """'bench model tiny --variant x' -> 'model tiny'; 'bench compare RUN' -> 'compare'."""
    if not words or not re.fullmatch(r"[a-z][a-z-]*", words[0]):
        return None
    if words[0] in groups and len(words) > 1:
        return f"{words[0]} {words[1]}"
    return words[0]


def section(text: str, title: str) -> str:
    """The body of a '## title' section, up to the next heading of its level or higher."""
    lines, out, inside = split_fences(text), [], False
    for code, line in lines:
        if not code and re.match(r"^#{1,2}\s", line):
            if inside:
                break
            inside = re.match(rf"^##\s+{re.escape(title)}\s*$", line) is not None
            continue
        if inside:
            out.append(line)
    return "\n".join(out)


def cheat_sheet(text: str, groups: set[str]) -> list[str]:
    """The commands of the README's cheat sheet: every code line there that starts with `bench `."""
    body = section(text, CHEAT_SHEET)
    out = []
    for code, line in split_fences(body):
        if code and line.startswith("bench "):
            cmd = bench_command(line.split()[1:], groups)
            if cmd:
                out.append(cmd)
    return out


def code_bench_commands(text: str, groups: set[str]) -> list[str]:
    """Every `bench <word>` written as code (fenced or inline), not as part of a longer name, nor vLLM's
    own `vllm bench ...`."""
    out = []
    for span in code_spans(text):
        for m in re.finditer(r"(?<![\w./-])(?<!vllm )bench((?:[ \t]+[^\s;|&)`]+){1,2})", span):
            cmd = bench_command(m.group(1).split(), groups)
            if cmd:
                out.append(cmd)
    return out


# ------------------------------------------------------------------ the checks

def test_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines (at most {MAX_README_LINES}): move reference to docs/"


def test_readme_prose_lines_are_of_a_readable_length():
    long = [f"{i}: {len(line)}" for i, (code, line) in enumerate(split_fences(README.read_text()), 1)
            if not code and len(line) > MAX_LINE]
    assert long == []


def test_readme_names_no_module_path():
    found = [f"{i}: {m.group(0)}" for i, line in enumerate(README.read_text().splitlines(), 1)
             for m in re.finditer(r"\b(?:orchestrator|adapters)/\S*", line)]
    assert found == [], "module paths belong in docs/architecture.md, not the README"


@pytest.mark.parametrize("path", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    assert broken_links(path) == []


@pytest.mark.parametrize("path", PATHS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_path_exists(path):
    assert missing_paths(path.read_text()) == []


def test_the_app_is_read_with_its_sub_apps():
    commands = app_commands()
    assert {"run", "compare", "gate"} <= commands
    assert app_groups() and all(" " in c for c in commands if c.split()[0] in app_groups()), commands


def test_the_cheat_sheet_lists_every_command_once_and_nothing_else():
    commands, groups = app_commands(), app_groups()
    listed = cheat_sheet(README.read_text(), groups)
    assert listed, f"README.md has no '## {CHEAT_SHEET}' section with a code block of `bench ...` lines"
    assert sorted(c for c in set(listed) if listed.count(c) > 1) == [], "a command listed twice"
    assert sorted(set(listed) - commands) == [], "not commands of bench"
    assert sorted(commands - set(listed)) == [], "commands of bench missing from the README's cheat sheet"


@pytest.mark.parametrize("path", CODE_COMMANDS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_bench_command_written_as_code_exists(path):
    commands, groups = app_commands(), app_groups()
    assert sorted(set(code_bench_commands(path.read_text(), groups)) - commands) == []


def test_the_docs_folder_has_an_index_that_links_every_page():
    index = ROOT / "docs" / "README.md"
    linked = {(index.parent / t.partition("#")[0]).resolve() for _, t in links(index.read_text())}
    pages = {p.resolve() for p in (ROOT / "docs").glob("*.md") if p != index}
    assert sorted(p.name for p in pages - linked) == []


# ------------------------------------------------------------------ each check fails on planted text

def test_slugs_follow_github():
    assert slug("Two servers: `bench diff-endpoints`") == "two-servers-bench-diff-endpoints"
    assert slug("`cells`") == "cells"
    assert slug("SLO search: the highest load that meets the SLOs") == "slo-search-the-highest-load-that-meets-the-slos"
    assert slug("What a cell measures") == "what-a-cell-measures"
    assert slug("A & B") == "a--b"
    assert anchors("# X\n## X\n```\n# not a heading\n```\n## Y_z\n") == {"x", "x-1", "y_z"}


def test_planted_broken_links_are_found(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## A section\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n## Here\n\n"
                    "[ok](other.md) [ok](other.md#a-section) [ok](#here) [web](https://example.com/x)\n"
                    "[gone](missing.md) [no heading](other.md#nowhere) [no local heading](#there)\n"
                    "`[in code](missing-too.md)`\n\n```\n[in a block](missing-three.md)\n```\n"
                    "[ref]: nothing.md\n")
    found = "\n".join(broken_links(page))
    for bad in ("missing.md: no such file", "other.md#nowhere: no heading #nowhere",
                "#there: no heading #there", "nothing.md: no such file"):
        assert bad in found
    assert len(broken_links(page)) == 4, found


def test_planted_missing_module_paths_are_found(tmp_path):
    (tmp_path / "orchestrator" / "judge").mkdir(parents=True)
    (tmp_path / "orchestrator" / "judge" / "gate.py").write_text("")
    text = ("see `orchestrator/judge/gate.py`, and orchestrator/judge/.\n"
            "gone: orchestrator/judge/gates.py, adapters/contract.py\n"
            "globbed: orchestrator/judge/*.py and orchestrator/report/*_panel.py; lossless-bench/adapters/x\n")
    assert missing_paths(text, tmp_path) == ["2: orchestrator/judge/gates.py", "2: adapters/contract.py",
                                             "3: orchestrator/report/*_panel.py"]


def test_planted_cheat_sheet_mistakes_are_found():
    groups = {"model"}
    text = ("# T\n\n## Commands\n\n```bash\nbench run MATRIX   # runs\nbench model tiny\nbench rnu X\n"
            "bench run again\n```\n\n## Verdicts\n\n```\nbench show RUN\n```\n")
    assert cheat_sheet(text, groups) == ["run", "model tiny", "rnu", "run"]
    spans = code_bench_commands("`bench compare RUN`, `lossless-bench cli`, `vllm bench serve` and\n"
                                "```\nbench model tiny --x\nbench ls ; bench shwo RUN\n```\n"
                                "`bench` alone, `bench --help`\n", groups)
    assert spans == ["compare", "model tiny", "ls", "shwo"]
