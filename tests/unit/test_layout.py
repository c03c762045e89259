"""The house's rules, checked by AST over every module of orchestrator/ and adapters/: which folder may
import which (each folder's __init__ docstring says it in words, RULES here in code, and the two must
agree), no import circles, no `_private` name imported from another module, the contract on the
standard library, numpy and pydantic alone, and folders and modules of a readable size. Each rule is
also run on planted sources that break it, so none of these checks can pass by checking nothing."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

O, A = "orchestrator", "adapters"

# folder (or top-level module) -> what it may import besides itself; lowest layers first
RULES: dict[str, set[str]] = {
    f"{O}.values": set(),
    f"{O}.inputs": {f"{O}.values", f"{A}.contract"},
    f"{O}.matrix": {f"{O}.values", f"{O}.inputs", A, f"{A}.base", f"{A}.contract"},
    f"{O}.store": {f"{O}.values", f"{O}.matrix", A, f"{A}.base", f"{A}.contract"},
    f"{O}.execution": {f"{O}.values", f"{O}.inputs", f"{O}.matrix", f"{O}.store", A, f"{A}.base", f"{A}.contract"},
    f"{O}.judge": {f"{O}.values", f"{O}.inputs", f"{O}.matrix", f"{O}.store", A, f"{A}.base", f"{A}.contract"},
    f"{O}.environments": {f"{O}.values"},
    f"{O}.endpoints": {f"{O}.judge", f"{A}.contract"},
    f"{O}.capacity": {f"{O}.values", f"{O}.matrix", f"{O}.store", f"{O}.judge"},
    f"{O}.report": {f"{O}.values", f"{O}.inputs", f"{O}.matrix", f"{O}.store", f"{O}.judge"},
    f"{O}.explain": {f"{O}.values", f"{O}.inputs", f"{O}.matrix", f"{O}.store", f"{O}.execution", f"{O}.judge", A,
                     f"{A}.base", f"{A}.contract"},
    f"{O}.cli": {f"{O}.values", f"{O}.inputs", f"{O}.matrix", f"{O}.store", f"{O}.execution", f"{O}.judge",
                 f"{O}.report", f"{O}.explain", f"{O}.environments", f"{O}.endpoints", f"{O}.capacity", A, f"{A}.base", f"{A}.contract"},
    f"{O}": set(),
    A: {f"{A}.base"},                                  # the registry
    f"{A}.contract": set(),
    f"{A}.base": {f"{A}.contract"},
    f"{A}.meters": {f"{A}.contract"},
    f"{A}.serving": {f"{A}.contract", f"{A}.meters", f"{A}.base"},
    f"{A}.engines": {f"{A}.base", f"{A}.contract", f"{A}.meters"},
    f"{A}.worker": {A, f"{A}.base", f"{A}.contract", f"{A}.meters", f"{A}.serving", f"{A}.engines"},
}
# what the contract may import from outside the project: every engine environment has these
# (inside functions: tokenizers and transformers where a tokenizer loads, pynvml where the host has GPUs)
CONTRACT_DEPS = {"numpy", "pydantic", "tokenizers", "transformers", "pynvml"}
MAX_MODULES_PER_FOLDER = 15
MAX_MODULE_LINES = 600


def unit_of(module: str) -> str:
    """The folder a module belongs to (orchestrator.judge.gate -> orchestrator.judge), or the module
    itself where it sits at the top (orchestrator.cli, adapters.base; adapters/__init__: adapters)."""
    parts = module.split(".")
    if len(parts) == 1:
        return module
    unit = ".".join(parts[:2])
    return unit if unit in RULES else unit


def project_sources() -> dict[str, str]:
    out = {}
    for top in (O, A):
        for f in sorted((ROOT / top).rglob("*.py")):
            if "data" in f.relative_to(ROOT / top).parts:
                continue   # shipped data (the built-in task sets' generator), not code the tool imports
            parts = f.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = f.read_text()
    return out


def imports(source: str) -> list[tuple[str, list[str], int]]:
    """(module, names imported from it, line) of every import, also inside functions and TYPE_CHECKING."""
    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
            out.append((n.module, [a.name for a in n.names], n.lineno))
        elif isinstance(n, ast.Import):
            out.extend((a.name, [], n.lineno) for a in n.names)
    return out


def _target(module: str, names: list[str], known: set[str]) -> list[str]:
    """The project modules an import reaches: `from orchestrator.judge import gate` reaches the module
    orchestrator.judge.gate, `from orchestrator.judge.gate import load_policy` reaches orchestrator.judge.gate."""
    subs = [f"{module}.{n}" for n in names if f"{module}.{n}" in known]
    return subs or [module]


def layer_violations(sources: dict[str, str]) -> list[str]:
    known = set(sources)
    out = []
    for mod, src in sources.items():
        unit = unit_of(mod)
        allowed = RULES.get(unit)
        if allowed is None:
            out.append(f"{mod}: in no folder of RULES ({unit})")
            continue
        for imported, names, line in imports(src):
            if imported.split(".")[0] not in (O, A):
                continue
            for target in _target(imported, names, known):
                tu = unit_of(target)
                if tu != unit and tu not in allowed:
                    out.append(f"{mod}:{line} imports {target}: {unit} may import only "
                               f"{', '.join(sorted(allowed)) or 'nothing of the project'}")
    return out


def circles(sources: dict[str, str]) -> list[list[str]]:
    """Strongly connected sets of more than one module in the import graph (Tarjan)."""
    known = set(sources)
    graph = {m: {t for imp, names, _ in imports(s) if imp.split(".")[0] in (O, A)
                 for t in _target(imp, names, known) if t in known and t != m} for m, s in sources.items()}
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def private_imports(sources: dict[str, str]) -> list[str]:
    return [f"{mod}:{line} imports {n} from {imported}" for mod, src in sources.items()
            for imported, names, line in imports(src) if imported.split(".")[0] in (O, A)
            for n in names if n.startswith("_") and not n.startswith("__")]


def contract_deps(sources: dict[str, str]) -> list[str]:
    stdlib = set(sys.stdlib_module_names)
    return [f"{mod}:{line} imports {imported}" for mod, src in sources.items() if unit_of(mod) == f"{A}.contract"
            for imported, _, line in imports(src)
            if imported.split(".")[0] not in stdlib | CONTRACT_DEPS and not imported.startswith(f"{A}.contract")]


def sizes(root: Path) -> list[str]:
    out = []
    for top in (O, A):
        for d in [root / top, *sorted(p for p in (root / top).rglob("*") if p.is_dir())]:
            if "__pycache__" in d.parts or "data" in d.relative_to(root / top).parts:
                continue
            mods = [f for f in d.glob("*.py") if f.name not in ("__init__.py", "__main__.py")]
            if len(mods) > MAX_MODULES_PER_FOLDER:
                out.append(f"{d.relative_to(root)}/ holds {len(mods)} modules (at most {MAX_MODULES_PER_FOLDER})")
            for f in mods:
                n = len(f.read_text().splitlines())
                if n > MAX_MODULE_LINES:
                    out.append(f"{f.relative_to(root)} has {n} lines (at most {MAX_MODULE_LINES})")
    return out


def stated_rule(docstring: str) -> set[str]:
    """The folders a docstring's "May import: a, b (the registry), c." sentence names."""
    m = re.search(r"May import:(.*?)(?:\.\s|\.$)", docstring.replace("\n", " "), re.S)
    if not m:
        return {"<no 'May import:' sentence>"}
    text = re.sub(r"\([^)]*\)", "", m.group(1))
    if "anything in adapters/" in text:
        return {u for u in RULES if u.startswith(A) and u != f"{A}.worker"}
    if "nothing" in text:
        return set()
    return {w.strip() for w in text.split(",") if w.strip()}


# ------------------------------------------------------------------ the rules on the project

SOURCES = project_sources()


def test_every_import_follows_the_folder_rules():
    assert layer_violations(SOURCES) == []


def test_each_folder_says_what_it_may_import_as_the_rules_do():
    for unit, allowed in RULES.items():
        path = ROOT / Path(*unit.split("."))
        if not path.is_dir() or unit in (O, A):
            continue
        doc = ast.get_docstring(ast.parse((path / "__init__.py").read_text())) or ""
        assert stated_rule(doc) == allowed, unit


def test_no_import_circles():
    assert circles(SOURCES) == []


def test_no_private_name_is_imported_from_another_module():
    assert private_imports(SOURCES) == []


def test_the_contract_imports_the_standard_library_numpy_and_pydantic_only():
    assert contract_deps(SOURCES) == []


def test_folders_and_modules_stay_readable():
    assert sizes(ROOT) == []


# ------------------------------------------------------------------ each rule fails on a planted violation

PLANTED = {
    "orchestrator.judge.planted": "from orchestrator.execution.runner import run_matrix\n",
    "orchestrator.execution.runner": "def run_matrix(): pass\n",
    "orchestrator.execution.planted": "from orchestrator.report import console\n",
    "orchestrator.report.console": "from orchestrator.judge.planted import x\n",
    "adapters.engines.planted": "from adapters.worker.group import main\n",
    "adapters.worker.group": "from adapters.engines import planted\ndef main(): pass\n",
    "adapters.meters.planted": "from orchestrator.store.run_store import RunStore\n",
    "orchestrator.store.run_store": "class RunStore: pass\n",
    "orchestrator.inputs.planted": "from orchestrator.matrix.models import Matrix\n",
    "orchestrator.matrix.models": "from orchestrator.inputs.planted import _helper\nclass Matrix: pass\n",
    "adapters.contract.planted": "import httpx\nfrom adapters.base import Adapter\n",
    "adapters.base": "from adapters.contract.planted import x\nclass Adapter: pass\n",
}


def test_a_planted_violation_of_each_rule_is_found():
    found = "\n".join(layer_violations(PLANTED))
    for line in ("orchestrator.judge.planted:1 imports orchestrator.execution.runner",   # judge -> execution
                 "orchestrator.execution.planted:1 imports orchestrator.report.console",  # execution -> report
                 "adapters.engines.planted:1 imports adapters.worker.group",              # engines -> worker
                 "adapters.meters.planted:1 imports orchestrator.store.run_store",        # adapters -> orchestrator
                 "orchestrator.inputs.planted:1 imports orchestrator.matrix.models",      # upward
                 "adapters.contract.planted:2 imports adapters.base"):                    # the contract is the floor
        assert line in found
    assert ["adapters.engines.planted", "adapters.worker.group"] in circles(PLANTED)
    assert ["orchestrator.inputs.planted", "orchestrator.matrix.models"] in circles(PLANTED)
    assert private_imports(PLANTED) == ["orchestrator.matrix.models:1 imports _helper from orchestrator.inputs.planted"]
    assert contract_deps(PLANTED) == ["adapters.contract.planted:1 imports httpx",
                                     "adapters.contract.planted:2 imports adapters.base"]
    assert stated_rule("Judging.\n\nMay import: orchestrator.values, adapters (the registry).\n") == {
        "orchestrator.values", "adapters"}


def test_oversized_folders_and_modules_are_found(tmp_path):
    big = tmp_path / "orchestrator" / "judge"
    big.mkdir(parents=True)
    (tmp_path / "adapters").mkdir()
    for i in range(MAX_MODULES_PER_FOLDER + 1):
        (big / f"m{i}.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1 if i == 0 else 1))
    found = sizes(tmp_path)
    assert f"orchestrator/judge/ holds {MAX_MODULES_PER_FOLDER + 1} modules (at most 15)" in found
    assert f"orchestrator/judge/m0.py has {MAX_MODULE_LINES + 1} lines (at most 600)" in found


@pytest.mark.parametrize("unit", sorted(RULES))
def test_every_rule_names_only_known_folders(unit):
    assert RULES[unit] <= set(RULES)
