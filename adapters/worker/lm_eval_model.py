"""An lm-evaluation-harness `LM` over any engine adapter, so every engine runs every lm-eval task with
the same tokenisation: the group's tokenizer encodes, the engine only scores and generates token ids.

    loglikelihood(context, continuation)   -> the adapter's teacher-forced `score` of context+continuation
    loglikelihood_rolling(text)            -> the same over rolling windows, after the EOS prefix token
    generate_until(context, gen_kwargs)    -> the adapter's greedy `greedy`, decoded, cut at `until` and EOS

Sampling in gen_kwargs (do_sample, temperature > 0) is refused, not emulated: the text layer samples
through each engine's own sampler, and this class decodes greedily only.
"""

from __future__ import annotations

import functools
import math
import os
from typing import TYPE_CHECKING

from adapters.contract.records import LmEvalItem, LmEvalOutput
from adapters.contract.specs import LmEvalTaskSpec
from adapters.contract.tokenizer import Tokenizer
from adapters.worker.task_scoring import choice_logprobs

if TYPE_CHECKING:
    from adapters.worker.task_scoring import Scorer

DEFAULT_MAX_GEN_TOKS = 256


def _lm_class():
    from lm_eval import utils
    from lm_eval.api.model import LM

    class AdapterLM(LM):
        def __init__(self, scorer: "Scorer", tok: Tokenizer, batch_size: int, max_length: int):
            super().__init__()
            self.scorer, self.tok, self.batch, self.max_length = scorer, tok, max(1, batch_size), max_length

        def _split(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
            # as lm-eval's own models: encode the whole, so a token spanning the boundary stays one token
            n_space = len(context) - len(context.rstrip())
            if n_space:
                context, continuation = context[:-n_space], context[-n_space:] + continuation
            whole = self.tok.encode(context + continuation)
            ctx = self.tok.encode(context)
            if not ctx:   # an empty context: condition on the EOS token, as lm-eval does
                return [self.tok.eos_id], whole
            return whole[:len(ctx)], whole[len(ctx):]

        def loglikelihood(self, requests) -> list[tuple[float, bool]]:
            pairs = [self._split(*r.args) for r in requests]
            got = choice_logprobs(self.scorer, [c for c, _ in pairs], [x for _, x in pairs], self.batch)
            return [(float(sum(lps)), greedy) for lps, greedy in got]

        def loglikelihood_rolling(self, requests) -> list[float]:
            out = []
            for r in requests:
                windows = [utils.make_disjoint_window(w) for w in utils.get_rolling_token_windows(
                    token_list=self.tok.encode(r.args[0]), prefix_token=self.tok.eos_id,
                    max_seq_len=self.max_length, context_len=1)]
                got = choice_logprobs(self.scorer, [c for c, _ in windows], [x for _, x in windows], self.batch)
                out.append(float(sum(sum(lps) for lps, _ in got)))
            return out

        def generate_until(self, requests) -> list[str]:
            jobs = []
            for r in requests:
                context, kwargs = r.args
                kwargs = dict(kwargs or {})
                if kwargs.get("do_sample") or (kwargs.get("temperature") or 0) > 0:
                    raise ValueError(f"lm-eval asked for sampling ({kwargs}); tasks decode greedily only")
                until = kwargs.get("until") or []
                n = int(kwargs.get("max_gen_toks") or DEFAULT_MAX_GEN_TOKS)
                jobs.append((self.tok.encode(context)[-(self.max_length - n):], n,
                             [until] if isinstance(until, str) else list(until)))
            out: list[str] = [""] * len(jobs)
            for n in sorted({n for _, n, _ in jobs}):   # batches of the cell's size, per generation length
                todo = [i for i, job in enumerate(jobs) if job[1] == n]
                for first in range(0, len(todo), self.batch):
                    chunk = todo[first:first + self.batch]
                    for i, scores in zip(chunk, self.scorer.greedy([jobs[i][0] for i in chunk], n, 1)):
                        out[i] = self.tok.cut(scores.token_ids.tolist(), jobs[i][2])
            return out

    return AdapterLM


def _score(sample: dict, metric: str) -> float | None:
    v = sample.get(metric)
    if isinstance(v, (list, tuple)):   # e.g. a metric whose per-item value is (prediction, reference)
        return None
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


@functools.lru_cache(maxsize=8)
def _task_manager(include_path: str | None, name: str):
    """lm-eval's task index, once per engine process. Indexing lm-eval's own ~15k task YAMLs takes
    ~17 s here: a task found in include_path alone skips them."""
    from lm_eval.tasks import TaskManager

    if include_path:
        local = TaskManager(include_path=include_path, include_defaults=False)
        if name in local.all_tasks:
            return local
    return TaskManager(include_path=include_path) if include_path else TaskManager()


def _loglikelihoods(resp) -> list[float] | None:
    """A multiple-choice item's responses, [(loglikelihood, is_greedy), ...], as the loglikelihoods."""
    if isinstance(resp, (list, tuple)) and len(resp) > 1 and all(
            isinstance(r, (list, tuple)) and len(r) == 2 and isinstance(r[0], (int, float)) for r in resp):
        return [float(r[0]) for r in resp]
    return None


def run_lm_eval(scorer: "Scorer", task: LmEvalTaskSpec, batch_size: int) -> LmEvalOutput:
    import lm_eval

    tok = Tokenizer(task.tokenizer, task.trust_remote_code)
    lm = _lm_class()(scorer, tok, batch_size, task.max_length)
    manager = _task_manager(task.include_path, task.task)
    here = os.getcwd()
    try:   # relative data_files in a task YAML resolve against its folder, wherever the engine runs
        if task.include_path:
            os.chdir(task.include_path)
        results = lm_eval.simple_evaluate(model=lm, tasks=[task.task], num_fewshot=task.num_fewshot, limit=task.limit,
                                          task_manager=manager, log_samples=True, bootstrap_iters=0)
    finally:
        os.chdir(here)
    samples = results["samples"][task.task]
    metrics = samples[0]["metrics"] if samples else []
    metric = task.metric or (metrics[0] if metrics else "")
    if samples and metric not in metrics:
        raise ValueError(f"lm-eval task {task.task} has no per-item metric {metric!r} (it has: {', '.join(metrics)})")
    items = []
    for s in sorted(samples, key=lambda s: s["doc_id"]):
        resp = s["filtered_resps"]
        choices = _loglikelihoods(resp)
        prediction = str(max(range(len(choices)), key=choices.__getitem__)) if choices else \
            str(resp[0] if isinstance(resp, list) and len(resp) == 1 else resp)
        items.append(LmEvalItem(
            doc_id=int(s["doc_id"]), score=_score(s, metric), target=str(s["target"]), prediction=prediction,
            metrics={m: x for m in metrics if (x := _score(s, m)) is not None}, choice_logprobs=choices))
    return LmEvalOutput(name=task.name, metric=metric, items=items)
