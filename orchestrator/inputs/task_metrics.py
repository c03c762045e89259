"""The task layer's per-item scores: every metric defined once, here, and the rows of the tasks table.

Generation predictions are the greedy ids cut at EOS and the task's stop strings (adapters.contract.tokenizer),
scored against each of the item's answers (the best counts):
  exact_match  SQuAD normalisation (lowercase, no punctuation, no articles, single spaces), then equal
  regex_match  the regex's first/last match in the prediction, normalised, equals a normalised answer
  contains     the normalised answer occurs in the normalised prediction
  token_f1     SQuAD token F1 of the normalised texts
  rouge_l      ROUGE-L F-measure (Google's rouge-score, stemmed)
  chrf, bleu   sacrebleu's sentence chrF and BLEU, divided by 100
Choice items, as lm-eval's multiple choice: acc is 1 when the answer's summed continuation logprob is the
highest (ties: the lower index, as numpy's argmax); acc_norm divides each sum by the characters of the
choice's text, acc_bytes by its UTF-8 bytes: the choice alone, without the target_delimiter that is scored
before it (lm-eval's `completion_len`). lm-eval items come scored by lm-eval's own task definition.

A task's figure aggregates its items' scores as lm-eval aggregates them (`AGGREGATIONS`, by lm-eval's
names; tests/unit/test_task_encoding.py pins each against lm-eval's own function):
  mean                 the mean score (every native metric)
  perplexity           exp(-mean loglikelihood)
  weighted_perplexity  exp(-sum loglikelihood / sum weight)   (word_perplexity, byte_perplexity)
  bits_per_byte        -sum loglikelihood / sum bytes / ln 2
"""

from __future__ import annotations

import collections
import functools
import json
import re
import string

import numpy as np

from adapters.contract.records import ChoiceOutput, GenerationOutput, LmEvalOutput, TaskError, TaskOutput
from adapters.contract.tokenizer import Tokenizer
from orchestrator.inputs.task_sets import ChoiceTask, GenerationTask, Items, TaskEntry

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize(text: str) -> str:
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCT)).split())


def token_f1(prediction: str, answer: str) -> float:
    p, a = normalize(prediction).split(), normalize(answer).split()
    common = sum((collections.Counter(p) & collections.Counter(a)).values())
    if not p or not a:
        return float(p == a)
    if not common:
        return 0.0
    precision, recall = common / len(p), common / len(a)
    return 2 * precision * recall / (precision + recall)


@functools.lru_cache(maxsize=1)
def _rouge():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def generation_score(entry: GenerationTask, prediction: str, answers: list[str]) -> float:
    """The item's score: the best over its answers."""
    m = entry.metric
    if m == "regex_match":
        found = re.findall(entry.regex, prediction)
        if not found:
            return 0.0
        pick = found[0] if entry.regex_pick == "first" else found[-1]
        pick = pick if isinstance(pick, str) else pick[0]   # a pattern with groups: the first group
        return float(any(normalize(pick) == normalize(a) for a in answers))
    if m == "exact_match":
        return float(any(normalize(prediction) == normalize(a) for a in answers))
    if m == "contains":
        return float(any(normalize(a) in normalize(prediction) for a in answers))
    if m == "token_f1":
        return max(token_f1(prediction, a) for a in answers)
    if m == "rouge_l":
        return max(_rouge().score(a, prediction)["rougeL"].fmeasure for a in answers)
    import sacrebleu

    if m == "chrf":
        return sacrebleu.sentence_chrf(prediction, answers).score / 100
    if m == "bleu":
        return sacrebleu.sentence_bleu(prediction, answers).score / 100
    raise ValueError(f"unknown generation metric {m!r}")


def _mean(scores: np.ndarray, weights: np.ndarray) -> np.ndarray:
    return scores.mean(axis=-1)


def _perplexity(scores: np.ndarray, weights: np.ndarray) -> np.ndarray:
    return np.exp(-scores.mean(axis=-1))


def _weighted_perplexity(scores: np.ndarray, weights: np.ndarray) -> np.ndarray:
    return np.exp(-scores.sum(axis=-1) / weights.sum(axis=-1))


def _bits_per_byte(scores: np.ndarray, weights: np.ndarray) -> np.ndarray:
    return -scores.sum(axis=-1) / weights.sum(axis=-1) / np.log(2)


# name -> f(scores, weights): the aggregate over the last axis (so a [resamples, items] array gives one per resample)
AGGREGATIONS = {"mean": _mean, "perplexity": _perplexity, "weighted_perplexity": _weighted_perplexity,
                "bits_per_byte": _bits_per_byte}


def aggregate(name: str | None, scores, weights=None):
    """The task figure of `scores` (the last axis: items) as lm-eval's aggregation `name` (None: mean)."""
    scores = np.asarray(scores, dtype=np.float64)
    weights = np.ones_like(scores) if weights is None else np.asarray(weights, dtype=np.float64)
    return AGGREGATIONS[name or "mean"](scores, weights)


def choice_pick(entry: ChoiceTask, logprobs: list[list[float]], texts: list[str]) -> int:
    sums = np.array([sum(lps) for lps in logprobs], dtype=np.float64)
    if entry.metric == "acc_norm":
        sums = sums / np.array([float(len(t)) for t in texts], dtype=np.float64)
    elif entry.metric == "acc_bytes":
        sums = sums / np.array([float(len(t.encode("utf-8"))) for t in texts], dtype=np.float64)
    return int(np.argmax(sums))


def task_rows(entry: TaskEntry, items: Items | None, output: TaskOutput, tok: Tokenizer) -> list[dict]:
    """One row per item of one task on one cell (the columns of orchestrator.store.schema.TASKS_SCHEMA)."""
    name = output.name
    if isinstance(output, TaskError):
        return []
    if isinstance(output, LmEvalOutput):
        return [{"task": name, "metric": output.metric, "item_index": it.doc_id, "score": it.score,
                 "prediction": it.prediction, "target": it.target, "choice_logprobs": it.choice_logprobs,
                 "score_weight": it.weight, "aggregation": output.aggregation,
                 "higher_is_better": output.higher_is_better} for it in output.items]
    rows = []
    if isinstance(output, GenerationOutput):
        for i, (ids, answers) in enumerate(zip(output.tokens, items.answers)):
            prediction = tok.cut(ids, entry.stop)
            rows.append({"task": name, "metric": entry.metric, "item_index": i,
                         "score": generation_score(entry, prediction, answers), "prediction": prediction,
                         "target": json.dumps(answers)})
        return rows
    assert isinstance(output, ChoiceOutput)
    for i, (lps, texts, answer) in enumerate(zip(output.logprobs, items.choices, items.answer_index)):
        pick = choice_pick(entry, lps, texts)
        rows.append({"task": name, "metric": entry.metric, "item_index": i, "score": float(pick == answer),
                     "prediction": str(pick), "target": str(answer),
                     "choice_logprobs": [float(sum(x)) for x in lps], "choice_tokens": [len(x) for x in lps]})
    return rows
