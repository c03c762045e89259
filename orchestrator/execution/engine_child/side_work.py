"""Work beside a run's cells (the baseline's rescoring, explain's layer captures): one cell's group spec,
stripped of its cells and layers and given one job of its own, run in an engine child whose .npz answer is
read and whose work dir is removed whatever happens."""

from __future__ import annotations

import shutil
from typing import Callable, TypeVar

import numpy as np

from adapters.contract.specs import GroupSpec
from orchestrator.execution.engine_child.prompts import Tokenizer
from orchestrator.execution.engine_child.spec import GroupJob, build_spec, tokenizer_source
from orchestrator.execution.engine_child.supervisor import run_child
from orchestrator.inputs import task_sets
from orchestrator.matrix.cells import Cell

T = TypeVar("T")


def cell_spec(job: GroupJob, cell: Cell) -> GroupSpec:
    """The spec `cell`'s group child would get for that cell alone (its prompts as token ids, no tasks)."""
    entry = job.matrix.model_entry(job.group.model)
    return build_spec(job, [cell], Tokenizer(tokenizer_source(job), entry.trust_remote_code), task_sets.load_tasks([]))


def run_side_work(job: GroupJob, spec: GroupSpec, work: dict, answer: str, timeout_s: float,
                  read: Callable[[np.lib.npyio.NpzFile], tuple[T | None, str | None]]) -> tuple[T | None, str | None]:
    """The child runs `spec` with no cells, scoring, sampling or tasks and `work` set (e.g. {"rescore": ...});
    (read(its `answer` file), or (None, why it did not finish))."""
    spec = spec.model_copy(update={"cells": [], "scoring": None, "sampling": None, "tasks": [], **work})
    path, why = run_child(job, spec, timeout_s)
    try:
        if why is not None:
            return None, why
        with np.load(path / answer) as f:
            return read(f)
    finally:
        shutil.rmtree(path, ignore_errors=True)
