"""What an engine group asks of a node, and whether a node can give it: pure functions, shared by the
scheduler, its simulation and `bench plan`.

A group asks for its GPUs (tensor x pipeline parallel, on one node) or CPUs, optionally for a node
that has declared its framework's environment (custom resource `env_<framework>`) and an accelerator
type. Groups no node can ever satisfy are found before the run starts. Which node and when is
orchestrator/execution/scheduling/dispatch.py's, how long a group takes orchestrator/execution/scheduling/estimate.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

from adapters import ADAPTERS

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


def engine_gpus(options: dict) -> int:
    """GPUs one engine uses: tensor x pipeline parallel size, from flags or resolved engine arguments
    (lmdeploy names them tp/pp). `bench plan`, the scheduler and the estimate all count them here."""

    def size(*names: str) -> int:
        for n in names:
            try:
                if options.get(n) is not None:
                    return max(1, int(options[n]))
            except (TypeError, ValueError):
                pass
        return 1

    return size("tensor_parallel_size", "tp") * size("pipeline_parallel_size", "pp")


def group_need(framework: str, options: dict, run, device: str, node_cpus: list[float]) -> Need:
    """What one engine group asks of a node. `node_cpus` are the CPU counts of the nodes that could host it."""
    custom = []
    if run.env_resources and getattr(ADAPTERS.get(framework), "own_environment", True):
        custom.append((env_resource(framework), MARKER))
    if run.accelerator_type:
        custom.append((accelerator_resource(run.accelerator_type), MARKER))
    if device == "cuda":
        gpus = run.gpus_per_group if run.gpus_per_group is not None else engine_gpus(options)
        return Need(cpus=1, gpus=gpus, custom=tuple(custom))
    # On CPU a group gets a whole node by default: two groups sharing cores would share their timings.
    cpus = max(node_cpus, default=1) if run.cpus_per_group == "node" else run.cpus_per_group
    return Need(cpus=cpus, gpus=run.gpus_per_group or 0, custom=tuple(custom))


def fits(need: Need, node_resources: dict[str, float]) -> bool:
    return all(node_resources.get(k, 0) >= v for k, v in need.as_resources().items() if v)


def infeasible_reason(need: Need, nodes: list[dict[str, float]]) -> str | None:
    if any(fits(need, n) for n in nodes):
        return None
    return f"no node in the cluster offers what this group needs ({need.describe()})"
