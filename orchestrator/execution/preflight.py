"""The preflight: after the matrix is valid and before Ray or any engine starts, each model of the cells to run is
resolved once, and each engine group (framework, model, quantization, flags) is checked against what its engine
can run. What cannot run is known here, once, not per cell on a node after an engine group starts:

- a model that cannot be had here: a hub id neither in the local Hugging Face cache nor reachable (one quick
  request to the hub, no retries; HF_HUB_OFFLINE=1 means not asked), or not found there. Its cells are `failed`
  with that one message, and the run says it once, up front;
- a pair its engine cannot run, from the model's config alone: each adapter's `Adapter.model_problem`
  (llama.cpp: an architecture its converter lacks, a hub id it cannot convert; vLLM on a CPU: a head size its
  CPU attention has no kernel for). Those cells are `unsupported` rows with the reason.

A model is resolved where the driver runs: a local path the driver does not have is asked of every node once Ray
is up (`check_nodes`, below: a path no node has fails its cells there, one some lack is named with them); checks
that need the engine itself stay in each group's `check`/`load`. Endpoint models (someone else's server) are not
checked.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import adapters
from adapters.contract.specs import ModelFacts
from orchestrator.execution.scheduling.model_size import cached_config
from orchestrator.execution.engine_child.spec import GroupJob, resolve_source


@dataclass
class Preflight:
    runnable: list[GroupJob] = field(default_factory=list)
    excluded: list[tuple[GroupJob, str, str]] = field(default_factory=list)   # (job, status, reason)
    model_problems: dict[str, str] = field(default_factory=dict)              # matrix model name -> why

    def messages(self) -> list[str]:
        """What the run prints before it starts: each model problem once, then the unsupported pairs."""
        out = []
        for name, why in self.model_problems.items():
            n = sum(len(j.group.cells) for j, _, r in self.excluded if j.group.model == name)
            out.append(f"model {name}: {why}; its {n} cell{'s' if n != 1 else ''} fail without starting an engine")
        pairs = {}
        for job, status, reason in self.excluded:
            if status == "unsupported":
                key = (job.group.framework, job.group.model, reason)
                pairs[key] = pairs.get(key, 0) + len(job.group.cells)
        for (fw, model, reason), n in pairs.items():
            out.append(f"{fw} x {model}: unsupported ({n} cell{'s' if n != 1 else ''}): {reason}")
        return out


def is_hub_id(source: str) -> bool:
    return "/" in source and not source.startswith((".", "/", "~")) and not Path(source).exists()


def head_dim(config: dict) -> int | None:
    cfg = config.get("text_config") or config
    if cfg.get("head_dim"):
        return int(cfg["head_dim"])
    hidden, heads = cfg.get("hidden_size"), cfg.get("num_attention_heads")
    return int(hidden) // int(heads) if hidden and heads else None


def architecture(config: dict) -> str | None:
    archs = (config.get("text_config") or {}).get("architectures") or config.get("architectures") or []
    return str(archs[0]) if archs else None


def facts_of(source: str, kind: str, config: dict | None) -> ModelFacts:
    return ModelFacts(source=source, kind=kind, config=config, architecture=architecture(config) if config else None,
                      head_dim=head_dim(config) if config else None)


def hub_config(repo_id: str, revision: str | None) -> tuple[dict | None, str | None]:
    """(config.json, None) of a hub model from the local cache or one request to the hub; (None, why) when the
    model cannot be had here. A hub that answers without a config (gated, no config.json) is not a problem."""
    cached = cached_config(repo_id, revision)
    if cached is not None:
        return json.loads(cached.read_text()), None
    if os.environ.get("HF_HUB_OFFLINE") in ("1", "true", "True", "yes"):
        return None, f"hub id {repo_id} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set"
    from huggingface_hub import HfApi, errors, hf_hub_download

    try:
        HfApi().model_info(repo_id, revision=revision, timeout=10)
    except (errors.RepositoryNotFoundError, errors.RevisionNotFoundError) as err:
        return None, f"hub id {repo_id}{'@' + revision if revision else ''} was not found on the hub ({type(err).__name__})"
    except errors.HfHubHTTPError:   # gated, rate-limited: the hub answered; the nodes may hold a token
        return None, None
    except Exception as err:        # no connection: once, not per cell
        return None, (f"hub id {repo_id} cannot be reached: it is not in the local Hugging Face cache and the hub "
                      f"did not answer ({type(err).__name__}: {str(err)[:200]})")
    try:
        return json.loads(Path(hf_hub_download(repo_id, "config.json", revision=revision)).read_text()), None
    except Exception:   # no config.json, gated: nothing to check it by
        return None, None


def resolve_model(entry, cache_dir: str) -> tuple[ModelFacts | None, str | None]:
    """(what is known of the model here, None) or (None, why it cannot be had)."""
    if entry.endpoint:
        return ModelFacts(source=entry.source, kind="endpoint"), None
    source = resolve_source(entry.source, cache_dir)
    path = Path(source).expanduser()
    if path.is_file():
        return facts_of(source, "gguf", None), None
    if path.is_dir():
        config = path / "config.json"
        return facts_of(source, "dir", json.loads(config.read_text()) if config.is_file() else None), None
    if is_hub_id(source):
        config, why = hub_config(source, entry.revision)
        return (None, why) if why else (facts_of(source, "hub", config), None)
    return facts_of(source, "elsewhere", None), None


Resolved = dict[str, tuple[ModelFacts | None, str | None]]


def resolve_models(matrix, names, cache_dir: str) -> Resolved:
    """Each named model of the matrix resolved once: matrix model name -> (facts, None) or (None, why not)."""
    return {name: resolve_model(matrix.model_entry(name), cache_dir) for name in dict.fromkeys(names)}


def preflight(jobs: list[GroupJob], models: Resolved | None = None) -> Preflight:
    """Split the engine groups into those to schedule and those whose rows are written now."""
    out = Preflight()
    if models is None:
        models = resolve_models(jobs[0].matrix, [j.group.model for j in jobs], jobs[0].cache_dir) if jobs else {}
    for job in jobs:
        g = job.group
        facts, why = models[g.model]
        if why:
            out.model_problems[g.model] = why
            out.excluded.append((job, "failed", f"preflight: {why}"))
            continue
        reason = adapters.ADAPTERS[g.framework].model_problem(facts, g.engine_quantization, g.options, job.device)
        if reason:
            out.excluded.append((job, "unsupported", reason))
        else:
            out.runnable.append(job)
    return out


# ------------------------------------------------------------------ on the nodes
#
# The preflight's part that runs where the models will be read. A model path the driver does not have (a
# cluster's shared or node-local disk: ModelFacts kind "elsewhere") is looked up on every alive node by one small
# Ray task pinned to it (no CPU asked, so a CPU-less head answers too), after Ray starts and before any engine
# group is scheduled. A path no node has fails its cells up front with one message; a path some nodes lack is
# named with those nodes (the scheduler does not know which disk holds what: a group placed there fails at load).

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
