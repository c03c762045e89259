"""The task layer's engine side: each task of a group run through the cell's own engine, at its batch size.

Anything with the adapter's `score` and `greedy` calls runs tasks: an offline adapter, or a served
cell's client (adapters.worker.served_cells). Generation tasks are greedy completions; choice tasks are the
teacher-forced logprobs of each choice's continuation after its context, the way lm-eval scores
multiple choice; lm-eval tasks run lm-eval's own evaluator on an LM class over the same two calls
(adapters.worker.lm_eval_model). A task that fails is a `TaskError` with its reason, never a missing row.
"""

from __future__ import annotations

import traceback

from adapters.base import Unsupported
from adapters.contract.records import ChoiceOutput, GenerationOutput, TaskError, TaskOutput
from adapters.contract.specs import ChoiceTaskSpec, GenerationTaskSpec, LmEvalTaskSpec, TaskSpec
from adapters.worker.cell_loop import chunks
from adapters.worker.task_scoring import Scorer, choice_logprobs


def run_generation(scorer: Scorer, task: GenerationTaskSpec, batch_size: int) -> GenerationOutput:
    tokens: list[list[int]] = []
    for batch in chunks(task.prompts, max(1, batch_size)):
        tokens += [s.token_ids.tolist() for s in scorer.greedy(batch, task.max_tokens, 1)]
    return GenerationOutput(name=task.name, tokens=tokens)


def run_choice(scorer: Scorer, task: ChoiceTaskSpec, batch_size: int) -> ChoiceOutput:
    contexts = [ctx for item in task.contexts for ctx in item]
    continuations = [c for choices in task.choices for c in choices]
    flat = iter(choice_logprobs(scorer, contexts, continuations, batch_size))
    logprobs, greedy = [], []
    for choices in task.choices:
        got = [next(flat) for _ in choices]
        logprobs.append([lps for lps, _ in got])
        greedy.append([g for _, g in got])
    return ChoiceOutput(name=task.name, logprobs=logprobs, greedy=greedy)


def run_task(scorer: Scorer, task: TaskSpec, batch_size: int) -> TaskOutput:
    try:
        if isinstance(task, GenerationTaskSpec):
            return run_generation(scorer, task, batch_size)
        if isinstance(task, ChoiceTaskSpec):
            return run_choice(scorer, task, batch_size)
        if isinstance(task, LmEvalTaskSpec):
            from adapters.worker.lm_eval_model import run_lm_eval  # lm-eval is imported only where a task asks for it

            return run_lm_eval(scorer, task, batch_size)
        raise TypeError(f"unknown task kind {type(task).__name__}")
    except Unsupported as err:
        return TaskError(name=task.name, reason=f"unsupported here: {err}")
    except Exception as err:
        tail = traceback.format_exc().strip().splitlines()[-3:]
        return TaskError(name=task.name, reason=f"{type(err).__name__}: {err} ({' | '.join(tail)})"[:2000])


def run_tasks(scorer: Scorer, tasks: list[TaskSpec], batch_size: int) -> list[TaskOutput]:
    return [run_task(scorer, t, batch_size) for t in tasks]
