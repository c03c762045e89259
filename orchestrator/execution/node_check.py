"""The preflight's part that runs where the models will be read. A model path the driver does not have (a
cluster's shared or node-local disk: ModelFacts kind "elsewhere") is looked up on every alive node by one small
Ray task pinned to it (no CPU asked, so a CPU-less head answers too), after Ray starts and before any engine
group is scheduled. A path no node has fails its cells up front with one message; a path some nodes lack is
named with those nodes (the scheduler does not know which disk holds what: a group placed there fails at load).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from adapters.contract.specs import ModelFacts
from orchestrator.execution.preflight import Preflight

CHECK_TIMEOUT_S = 60.0


def paths_present(paths: list[str]) -> dict[str, bool]:
    """Runs on a node: which of the paths exist there."""
    return {p: Path(p).expanduser().exists() for p in paths}


@dataclass
class NodeFindings:
    nodes: list[str]                      # every node asked, as "address (id)"
    missing: dict[str, list[str]]         # model path -> the nodes that lack it
    unanswered: list[str]                 # nodes whose check did not come back in time

    def lack_everywhere(self, path: str) -> bool:
        answered = len(self.nodes) - len(self.unanswered)
        return answered > 0 and len(self.missing.get(path, [])) == answered


def ask_nodes(paths: list[str]) -> NodeFindings:
    """One pinned task per alive node, each answering for every path."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    check = ray.remote(num_cpus=0, max_retries=0)(paths_present)
    alive = [n for n in ray.nodes() if n.get("Alive")]
    names = [f"{n['NodeManagerAddress']} ({n['NodeID'][:8]})" for n in alive]
    refs = [check.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(paths)
            for n in alive]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=CHECK_TIMEOUT_S)
    missing: dict[str, list[str]] = {}
    unanswered = []
    for name, ref in zip(names, refs):
        if ref not in ready:
            unanswered.append(name)
            continue
        try:
            found = ray.get(ref)
        except Exception:      # a node that died under the check says nothing of its disk
            unanswered.append(name)
            continue
        for path, there in found.items():
            if not there:
                missing.setdefault(path, []).append(name)
    return NodeFindings(names, missing, unanswered)


def apply_findings(checked: Preflight, models: dict[str, tuple[ModelFacts | None, str | None]],
                   found: NodeFindings) -> list[str]:
    """Moves the groups of a model no node has to the failed rows; returns what the run prints."""
    lines = []
    sources = {name: facts.source for name, (facts, _) in models.items() if facts and facts.kind == "elsewhere"}
    for name, source in sources.items():
        lacking = found.missing.get(source, [])
        if found.lack_everywhere(source):
            why = (f"model path {source} is on neither this machine nor any of the {len(lacking)} node(s) that "
                   f"answered")
            checked.model_problems[name] = why
            checked.excluded += [(j, "failed", f"preflight: {why}") for j in checked.runnable if j.group.model == name]
            checked.runnable = [j for j in checked.runnable if j.group.model != name]
        elif lacking:
            lines.append(f"model {name}: {source} is missing on {len(lacking)} of {len(found.nodes)} nodes "
                         f"({', '.join(lacking)}): a group placed there fails at load")
    if found.unanswered and sources:
        lines.append(f"model paths not checked on {', '.join(found.unanswered)} (no answer in {CHECK_TIMEOUT_S:g} s)")
    return lines


def check_nodes(checked: Preflight, models: dict[str, tuple[ModelFacts | None, str | None]]) -> list[str]:
    """The node check where the run has models only nodes can have; nothing to do otherwise."""
    paths = sorted({f.source for f, _ in models.values() if f and f.kind == "elsewhere"})
    if not paths or not checked.runnable:
        return []
    return apply_findings(checked, models, ask_nodes(paths))
