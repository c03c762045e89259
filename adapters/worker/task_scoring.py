"""What every task kind asks of an engine: the two calls (`Scorer`) and a continuation's logprobs after
its context, shared by the task runner (adapters/worker/task_runner.py) and lm-eval's LM class
(adapters/worker/lm_eval_model.py)."""

from __future__ import annotations

from typing import Protocol

from adapters.contract.records import TokenScores


class Scorer(Protocol):
    def score(self, prompts: list[list[int]], top_k: int) -> list[TokenScores]: ...

    def greedy(self, prompts: list[list[int]], n_tokens: int, top_k: int) -> list[TokenScores]: ...


def choice_logprobs(scorer: Scorer, contexts: list[list[int]], continuations: list[list[int]],
                    batch_size: int) -> list[tuple[list[float], bool]]:
    """Per (context, continuation): the continuation tokens' logprobs and whether each was the top-1.
    The teacher-forced row i scores token i+1, so the continuation is the last len(continuation) rows."""
    out = []
    seqs = [c + x for c, x in zip(contexts, continuations)]
    for first in range(0, len(seqs), max(1, batch_size)):
        batch = seqs[first:first + batch_size]
        for j, s in enumerate(scorer.score(batch, 1)):
            n = len(continuations[first + j])
            lps = s.logprobs[len(s) - n:]
            out.append(([float(x) for x in lps], bool((s.token_ids[len(s) - n:] == s.topk_ids[len(s) - n:, 0]).all())))
    return out
