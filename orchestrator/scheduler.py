"""Engine groups -> Ray tasks. One task per group, asking for the group's GPUs or CPUs.

The driver is the only writer of results: tasks hand their rows back and the driver stores each
group as soon as its task finishes. A task lost with its node is submitted again (bounded); a
group no node can satisfy is reported before anything starts.
"""

from __future__ import annotations

import os
from typing import Callable

import ray

from orchestrator import placement, reaper
from orchestrator.launcher import CellResult, GroupJob, base_row, run_group

Rows = list[CellResult]


def init_ray(address: str | None = None) -> None:
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    else:
        # address="local": always a fresh local instance; without it ray.init joins any cluster another
        # process started on this machine (`ray start`, ray.cluster_utils), and then rejects num_cpus.
        # The cluster is this driver's: a watchdog kills what is left of it when the driver ends (reaper.py)
        reaper.start()
        ctx = ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, logging_level="WARNING",
                       log_to_driver=False)
        reaper.watch(ctx.address_info["session_dir"])


def cluster_device() -> str:
    return "cuda" if ray.cluster_resources().get("GPU", 0) > 0 else "cpu"


def alive_nodes() -> list[dict[str, float]]:
    return [n["Resources"] for n in ray.nodes() if n["Alive"]]


def job_need(job: GroupJob, nodes: list[dict[str, float]]) -> placement.Need:
    g, run = job.group, job.matrix.run
    # a CPU group's "whole node" is sized on the nodes that could host it at all
    routed = placement.group_need(g.framework, g.options, run, job.device, [])
    hosts = [n.get("CPU", 0) for n in nodes if placement.fits(routed, {**n, "CPU": float("inf")})]
    return placement.group_need(g.framework, g.options, run, job.device, hosts)


# max_retries=0: Ray does not re-run a group by itself; the driver decides (node loss only).
# No engine runs in the Ray worker (each group's engine is a child interpreter that exits with it), so
# CPU groups reuse Ray workers: a fresh one per group (max_calls=1) cost 0.7-2 s of the group's time on
# a 2-core host, and its replacement started while the next group's engine was being timed. GPU groups
# keep a fresh worker each (max_calls=1, Ray's own default for GPU tasks; Ray takes it only in the decorator).
def _run_on_node(job: GroupJob) -> Rows:
    node = ray.get_runtime_context().get_node_id()
    return [r._replace(row=r.row | {"node_id": node}) for r in run_group(job)]


@ray.remote(max_retries=0)
def _group_task(job: GroupJob) -> Rows:
    return _run_on_node(job)


@ray.remote(max_retries=0, max_calls=1)
def _gpu_group_task(job: GroupJob) -> Rows:
    return _run_on_node(job)


def status_rows(job: GroupJob, status: str, reason: str) -> Rows:
    return [CellResult(base_row(job, c) | {"status": status, "reason": reason}) for c in job.group.cells]


def estimate(job: GroupJob) -> float:
    source = job.matrix.model_entry(job.group.model).source
    return placement.estimate_seconds(placement.model_bytes(source), len(job.group.cells))


def schedule(jobs: list[GroupJob], on_done: Callable[[GroupJob, Rows], None]) -> None:
    """Run every job on the cluster; call on_done(job, rows) in the driver as each finishes."""
    nodes = alive_nodes()
    runnable = []
    for job in jobs:
        reason = placement.infeasible_reason(job_need(job, nodes), nodes)
        if reason:
            on_done(job, status_rows(job, "unsupported", reason))
        else:
            runnable.append(job)
    pending: dict = {}

    def submit(job: GroupJob, nodes: list[dict[str, float]]) -> None:
        job.tries += 1
        need = job_need(job, nodes)
        task = _gpu_group_task if need.gpus else _group_task
        pending[task.options(**need.ray_options()).remote(job)] = job

    for job in placement.longest_first(runnable, estimate):
        submit(job, nodes)
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        for ref in done:
            job = pending.pop(ref)
            try:
                rows = ray.get(ref)
            except Exception as err:  # the task's worker or node died; run_group itself never raises
                if job.tries <= job.matrix.run.node_retries:
                    submit(job, alive_nodes())  # sized on the nodes left after the loss
                    continue
                rows = status_rows(job, "failed", f"lost {job.tries} times (node or worker died): "
                                                  f"{type(err).__name__}: {str(err)[-1500:]}")
            on_done(job, rows)
