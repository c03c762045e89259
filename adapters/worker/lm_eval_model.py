"""An lm-evaluation-harness `LM` over any engine adapter, so every engine runs every lm-eval task the way
lm-eval's own HF backend builds its requests: the group's tokenizer encodes, the engine only scores and
generates token ids.

    loglikelihood(context, continuation)   lm-eval's own (TemplateLM: `_encode_pair`'s split, the prefix
                                           token for an empty context) over the adapter's teacher-forced `score`
    loglikelihood_rolling(text)            lm-eval's rolling windows after its prefix token (BOS, else EOS)
    generate_until(context, gen_kwargs)    the adapter's greedy `greedy`, cut at EOS, decoded without special
                                           tokens, then cut at `until` (plus EOS's text) by lm-eval's own helpers
Texts encode with the tokenizer's default special tokens, as lm-eval's HF backend (`Tokenizer.encode_task`).
Sampling in gen_kwargs (do_sample, temperature > 0) is refused, not emulated: the text layer samples
through each engine's own sampler, and this class decodes greedily only.
"""

from __future__ import annotations

import functools
import math
import os
from typing import TYPE_CHECKING

from adapters.contract.records import LmEvalItem, LmEvalOutput
from adapters.contract.specs import JUDGED_AGGREGATIONS, LmEvalTaskSpec
from adapters.contract.tokenizer import Tokenizer
from adapters.worker.task_scoring import choice_logprobs

if TYPE_CHECKING:
    from adapters.worker.task_scoring import Scorer

DEFAULT_MAX_GEN_TOKS = 256   # lm-eval's HF backend's max_gen_toks
# multiple choice: the metric -> what each choice's loglikelihood is divided by before the argmax (lm-eval's)
_PICK_BY = {"acc": lambda text: 1.0, "acc_norm": lambda text: float(len(text)),
            "acc_bytes": lambda text: float(len(text.encode("utf-8")))}


def _lm_class():
    from lm_eval import utils
    from lm_eval.api.model import TemplateLM
    from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text

    class AdapterLM(TemplateLM):
        def __init__(self, scorer: "Scorer", tok: Tokenizer, batch_size: int, max_length: int):
            super().__init__()
            self.scorer, self.tok, self.batch, self._max_length = scorer, tok, max(1, batch_size), max_length

        @property
        def eot_token_id(self) -> int:
            return self.tok.eos_id

        @property
        def prefix_token_id(self) -> int:
            return self.tok.prefix_id

        @property
        def max_length(self) -> int:
            return self._max_length

        def tok_encode(self, string: str, add_special_tokens: bool | None = None, left_truncate_len: int | None = None,
                       **kwargs) -> list[int]:
            if add_special_tokens is None:
                ids = self.tok.encode_task(string)
            else:
                ids = self.tok.encode_default(string) if add_special_tokens else self.tok.encode(string)
            return ids[-left_truncate_len:] if left_truncate_len else ids

        def _loglikelihood_tokens(self, requests, **kwargs) -> list[tuple[float, bool]]:
            # as lm-eval's HF backend: the last max_length + 1 tokens of context + continuation
            contexts, continuations = [], []
            for _, ctx, cont in requests:
                whole = (ctx + cont)[-(self.max_length + 1):]
                contexts.append(whole[:len(whole) - len(cont)])
                continuations.append(whole[len(whole) - len(cont):])
            got = choice_logprobs(self.scorer, contexts, continuations, self.batch)
            return [(float(sum(lps)), greedy) for lps, greedy in got]

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
            out = []
            for r in requests:   # each document apart, as lm-eval's HF backend
                windows = [utils.make_disjoint_window(w) for w in utils.get_rolling_token_windows(
                    token_list=self.tok_encode(r.args[0]), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1)]
                got = self._loglikelihood_tokens([(None, ctx, cont) for ctx, cont in windows])
                out.append(float(sum(ll for ll, _ in got)))
            return out

        def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
            eos = self.tok.decode([self.eot_token_id])
            jobs = []
            for r in requests:
                context, gen_kwargs = r.args
                kwargs = normalize_gen_kwargs(dict(gen_kwargs or {}), DEFAULT_MAX_GEN_TOKS)
                if kwargs.get("do_sample") or (kwargs.get("temperature") or 0) > 0:
                    raise ValueError(f"lm-eval asked for sampling ({gen_kwargs}); tasks decode greedily only")
                until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
                n = int(kwargs.pop("max_gen_toks"))
                jobs.append((self.tok_encode(context, left_truncate_len=self.max_length - n), n, until))
            out: list[str] = [""] * len(jobs)
            for n in sorted({n for _, n, _ in jobs}):   # batches of the cell's size, per generation length
                todo = [i for i, job in enumerate(jobs) if job[1] == n]
                for first in range(0, len(todo), self.batch):
                    chunk = todo[first:first + self.batch]
                    for i, scores in zip(chunk, self.scorer.greedy([jobs[i][0] for i in chunk], n, 1)):
                        out[i] = postprocess_generated_text(self.tok.cut(scores.token_ids.tolist(), []),
                                                            jobs[i][2], None)
            return out

    return AdapterLM


def _value(v) -> tuple[float | None, float | None]:
    """A per-item metric as (value, weight): a number, or lm-eval's (loglikelihood, words | bytes) pair of
    its perplexity metrics. (None, None): no per-item number (e.g. (gold, prediction) pairs)."""
    weight = None
    if isinstance(v, (list, tuple)):
        if len(v) != 2 or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            return None, None
        v, weight = v[0], float(v[1])
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None, None
    return (v, weight) if math.isfinite(v) else (None, None)


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


def _aggregation_name(fn) -> str:
    from lm_eval.api.registry import get_aggregation

    return next((n for n in JUDGED_AGGREGATIONS if get_aggregation(n) is fn), getattr(fn, "__name__", str(fn)))


def _evaluate(lm, task: LmEvalTaskSpec):
    """lm-eval's own evaluator on the task: (its Task object, its results with every sample)."""
    import lm_eval
    from lm_eval.tasks import get_task_dict

    manager = _task_manager(task.include_path, task.task)
    here = os.getcwd()
    try:   # relative data_files in a task YAML resolve against its folder, wherever the engine runs
        if task.include_path:
            os.chdir(task.include_path)
        found = get_task_dict([task.task], manager)
        task_obj = found.get(task.task)
        if task_obj is None or isinstance(task_obj, dict) or len(found) != 1:
            raise ValueError(f"lm-eval {task.task!r} is a group ({', '.join(map(str, found))}): list its tasks one by one")
        results = lm_eval.simple_evaluate(model=lm, tasks=[task_obj], num_fewshot=task.num_fewshot, limit=task.limit,
                                          task_manager=manager, log_samples=True, bootstrap_iters=0)
    finally:
        os.chdir(here)
    return task_obj, results


def run_lm_eval(scorer: "Scorer", task: LmEvalTaskSpec, batch_size: int) -> LmEvalOutput:
    tok = Tokenizer(task.tokenizer, task.trust_remote_code)
    task_obj, results = _evaluate(_lm_class()(scorer, tok, batch_size, task.max_length), task)
    samples = results["samples"][task.task]
    metrics = samples[0]["metrics"] if samples else []
    metric = task.metric or (metrics[0] if metrics else "")
    if samples and metric not in metrics:
        raise ValueError(f"lm-eval task {task.task} has no per-item metric {metric!r} (it has: {', '.join(metrics)})")
    aggregation = _aggregation_name(task_obj.aggregation()[metric])
    if aggregation not in JUDGED_AGGREGATIONS:
        raise ValueError(f"lm-eval aggregates {metric} of {task.task} with {aggregation!r} over the whole set; bench "
                         f"judges item by item, metrics aggregated by {', '.join(JUDGED_AGGREGATIONS)} only")
    items = []
    for s in sorted(samples, key=lambda s: s["doc_id"]):
        resp = s["filtered_resps"]
        choices = _loglikelihoods(resp)
        if choices:   # the pick of the metric stored beside it, by lm-eval's own choice texts (no delimiter)
            texts = task_obj.doc_to_choice(s["doc"])
            by = _PICK_BY.get(metric, _PICK_BY["acc"])
            per = [ll / by(t) for ll, t in zip(choices, texts)] if len(texts) == len(choices) else choices
            prediction = str(max(range(len(per)), key=per.__getitem__))
        else:
            prediction = str(resp[0] if isinstance(resp, list) and len(resp) == 1 else resp)
        score, weight = _value(s.get(metric))
        values = {m: v for m in metrics if (v := _value(s.get(m))[0]) is not None}
        items.append(LmEvalItem(doc_id=int(s["doc_id"]), score=score, weight=weight, prediction=prediction,
                                target=str(s["target"]), metrics=values, choice_logprobs=choices))
    if items and all(it.score is None for it in items):
        raise ValueError(f"lm-eval gave no per-item number for {metric} of {task.task} (e.g. {samples[0].get(metric)!r})")
    reference = results["results"][task.task].get(f"{metric},none")
    return LmEvalOutput(name=task.name, metric=metric, aggregation=aggregation,
                        higher_is_better=bool(task_obj.higher_is_better().get(metric, True)), items=items,
                        lm_eval_value=reference if isinstance(reference, (int, float)) else None)
