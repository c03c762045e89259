"""Where and in which order engine groups run: pure functions, shared by the scheduler and its simulation.

A group asks for its GPUs (tensor parallel on one node) or CPUs, optionally for a node that has
declared its framework's environment (custom resource `env_<framework>`) and an accelerator type.
Groups no node can ever satisfy are found before the run starts. Groups start longest first
(an estimate from model size and cell count), which keeps the makespan near its lower bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# Tiny amounts of the marker resources: they route a task without limiting how many run at once.
MARKER = 0.001


def env_resource(framework: str) -> str:
    """The custom resource a node declares when it has this framework's environment."""
    return f"env_{framework}"


def accelerator_resource(accelerator_type: str) -> str:
    return f"accelerator_type:{accelerator_type}"


@dataclass(frozen=True)
class Need:
    cpus: float
    gpus: float
    custom: tuple[tuple[str, float], ...] = ()

    def as_resources(self) -> dict[str, float]:
        return {"CPU": self.cpus, "GPU": self.gpus, **dict(self.custom)}

    def ray_options(self) -> dict:
        opts = {"num_cpus": self.cpus, "num_gpus": self.gpus}
        if self.custom:
            opts["resources"] = dict(self.custom)
        return opts

    def describe(self) -> str:
        return ", ".join(f"{k}={v:g}" for k, v in self.as_resources().items() if v)


def group_need(framework: str, options: dict, run, device: str, node_cpus: list[float]) -> Need:
    """What one engine group asks of a node. `node_cpus` are the CPU counts of the nodes that could host it."""
    custom = []
    if run.env_resources:
        custom.append((env_resource(framework), MARKER))
    if run.accelerator_type:
        custom.append((accelerator_resource(run.accelerator_type), MARKER))
    tp = int(options.get("tensor_parallel_size", 1))
    if device == "cuda":
        return Need(cpus=1, gpus=run.gpus_per_group if run.gpus_per_group is not None else tp, custom=tuple(custom))
    # On CPU a group gets a whole node by default: two groups sharing cores would share their timings.
    cpus = max(node_cpus, default=1) if run.cpus_per_group == "node" else run.cpus_per_group
    return Need(cpus=cpus, gpus=run.gpus_per_group or 0, custom=tuple(custom))


def fits(need: Need, node_resources: dict[str, float]) -> bool:
    return all(node_resources.get(k, 0) >= v for k, v in need.as_resources().items() if v)


def infeasible_reason(need: Need, nodes: list[dict[str, float]]) -> str | None:
    if any(fits(need, n) for n in nodes):
        return None
    return f"no node in the cluster offers what this group needs ({need.describe()})"


def model_bytes(source: str) -> int:
    """Size of a local checkpoint (its weight files); unknown (a hub id) counts as 1 GB."""
    path = Path(source)
    if path.is_file():
        return path.stat().st_size
    if path.is_dir():
        files = [f for f in path.rglob("*") if f.suffix in (".safetensors", ".bin", ".gguf", ".pt")]
        if files:
            return sum(f.stat().st_size for f in files)
    return 1 << 30


def estimate_seconds(weight_bytes: int, n_cells: int, load_s_per_gb: float = 10.0, cell_s_per_gb: float = 5.0,
                     fixed_s: float = 5.0) -> float:
    """A rough duration: loading grows with the weights, each cell with the weights too."""
    gb = weight_bytes / 1e9
    return fixed_s + load_s_per_gb * gb + n_cells * (fixed_s + cell_s_per_gb * gb)


def longest_first(items: list, estimate) -> list:
    """Longest processing time first: a greedy list schedule within 4/3 of the optimum."""
    return sorted(items, key=estimate, reverse=True)
