"""The baseline's engine scoring other cells' seeded samples, teacher forced (a GroupSpec with `rescore`).

Each sample is scored as its prompt followed by its sampled ids, in one forward pass of this engine
(`Adapter.score`): the raw logprob of every sampled token given the prompt and the sample's earlier tokens,
and the top-k candidates at its position. The sampling layer then judges every cell's samples under this
one model's probabilities (orchestrator/judge/sampling_verdicts.py), so the engine that drew a sample no
longer also grades it.
"""

from __future__ import annotations

import numpy as np

from adapters.base import Adapter, Unsupported
from adapters.contract.records import TOPK_PAD_ID, TOPK_PAD_LOGPROB
from adapters.contract.specs import RescoreSpec
from adapters.worker.cell_loop import chunks


def rescore(adapter: Adapter, spec: RescoreSpec) -> dict[str, np.ndarray]:
    """`logprobs` [samples, tokens] (each sampled token's raw logprob; padded with nan past a shorter
    sample), `topk_ids` / `topk_logprobs` [samples, tokens, k] and `lengths` [samples]. An engine that cannot
    give k candidates (vLLM's max_logprobs) gives the sampled tokens' logprobs alone (k = 0)."""
    width = max((len(s.tokens) for s in spec.samples), default=0)
    try:
        return _score_all(adapter, spec, width, spec.top_k)
    except Unsupported:
        return _score_all(adapter, spec, width, 0)


def _score_all(adapter: Adapter, spec: RescoreSpec, width: int, k: int) -> dict[str, np.ndarray]:
    n = len(spec.samples)
    lps = np.full((n, width), np.nan, np.float32)
    ids = np.full((n, width, k), TOPK_PAD_ID, np.int32)
    tops = np.full((n, width, k), TOPK_PAD_LOGPROB, np.float32)
    first = 0
    for batch in chunks(spec.samples, spec.batch_size):
        seqs = [spec.prompts[s.prompt_index] + s.tokens for s in batch]
        for j, (s, scores) in enumerate(zip(batch, adapter.score(seqs, k))):
            # row r of a score scores token r + 1: the sample's first token is row len(prompt) - 1
            at, m = len(spec.prompts[s.prompt_index]) - 1, len(s.tokens)
            got = scores.token_ids[at:at + m]
            if not np.array_equal(got, np.asarray(s.tokens, np.int32)):
                raise RuntimeError(f"{adapter.name}: teacher-forced scores do not line up with the sample's ids")
            lps[first + j, :m] = scores.logprobs[at:at + m]
            if k:
                w = min(k, scores.topk_ids.shape[1])
                ids[first + j, :m, :w] = scores.topk_ids[at:at + m, :w]
                tops[first + j, :m, :w] = scores.topk_logprobs[at:at + m, :w]
        first += len(batch)
    return {"logprobs": lps, "topk_ids": ids, "topk_logprobs": tops,
            "lengths": np.asarray([len(s.tokens) for s in spec.samples], np.int32)}

