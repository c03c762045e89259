"""Engine groups -> Ray tasks. One task per group, asking for the group's GPUs or CPUs.

The driver is the only writer of results: tasks hand their rows back and the driver stores each
group as soon as its task finishes.
"""

from __future__ import annotations

import os
from typing import Callable

import pyarrow as pa
import ray

from orchestrator.launcher import GroupJob, base_row, run_group

Rows = list[tuple[dict, pa.Table | None]]


def init_ray(address: str | None = None) -> None:
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    else:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="WARNING", log_to_driver=False)


def cluster_device() -> str:
    return "cuda" if ray.cluster_resources().get("GPU", 0) > 0 else "cpu"


def largest_node_cpus() -> int:
    return int(max((n["Resources"].get("CPU", 0) for n in ray.nodes() if n["Alive"]), default=1))


def task_resources(job: GroupJob) -> dict:
    run = job.matrix.run
    if job.device == "cuda":
        tp = int(job.group.options.get("tensor_parallel_size", 1))
        return {"num_gpus": run.gpus_per_group if run.gpus_per_group is not None else tp, "num_cpus": 1}
    cpus = largest_node_cpus() if run.cpus_per_group == "node" else run.cpus_per_group
    return {"num_cpus": cpus, "num_gpus": 0}


# max_retries=0: a group that kills its worker is reported, not silently re-run with the same fate.
# max_calls=1: a fresh Ray worker per group, so no engine state leaks from one group to the next.
@ray.remote(max_retries=0, max_calls=1)
def _group_task(job: GroupJob) -> Rows:
    return run_group(job)


def failed_rows(job: GroupJob, reason: str) -> Rows:
    return [(base_row(job, c) | {"status": "failed", "reason": reason}, None) for c in job.group.cells]


def schedule(jobs: list[GroupJob], on_done: Callable[[GroupJob, Rows], None]) -> None:
    """Run every job on the cluster; call on_done(job, rows) as each finishes, in the driver."""
    # bigger groups first, so one long group does not start last and stretch the run
    jobs = sorted(jobs, key=lambda j: len(j.group.cells), reverse=True)
    pending = {}
    for job in jobs:
        ref = _group_task.options(**task_resources(job)).remote(job)
        pending[ref] = job
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        for ref in done:
            job = pending.pop(ref)
            try:
                rows = ray.get(ref)
            except Exception as err:  # the Ray worker itself died, or the task raised
                rows = failed_rows(job, f"ray task failed: {type(err).__name__}: {str(err)[-1500:]}")
            on_done(job, rows)
