"""Prompts as token ids, made once per group on the node and handed to the engine as ids.

Every engine of a model gets the same ids (never re-tokenized text), so their logprobs compare
position by position.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from adapters.tokenizer import Tokenizer
from orchestrator.matrix import DatasetWorkload, Measure, SyntheticWorkload


def builtin_text(name: str) -> str:
    return (Path(__file__).parent / "data" / name).read_text()


def scoring_prompts(measure: Measure, tok: Tokenizer) -> list[list[int]]:
    """Consecutive chunks of the scoring text, `scoring_len` tokens each."""
    text = builtin_text("eval.txt") if measure.scoring_text == "builtin" else Path(measure.scoring_text).read_text()
    ids = tok.encode(text)
    need = measure.scoring_prompts * measure.scoring_len
    if len(ids) < need:
        raise ValueError(f"measure.scoring_text has {len(ids)} tokens; {need} are needed "
                         f"(scoring_prompts x scoring_len)")
    return [ids[i * measure.scoring_len:(i + 1) * measure.scoring_len] for i in range(measure.scoring_prompts)]


def timing_prompts(workload: SyntheticWorkload | DatasetWorkload, tok: Tokenizer, n: int, input_len: int) -> list[list[int]]:
    """n prompts of input_len tokens. Prompt i is the same for every batch size and engine."""
    if isinstance(workload, SyntheticWorkload):
        rng = np.random.default_rng([workload.seed, input_len])
        allowed = np.array([i for i in range(tok.vocab_size) if i not in tok.special_ids])
        prefix_len = min(workload.shared_prefix_len, input_len)
        prefix = rng.choice(allowed, prefix_len).tolist()
        return [prefix + rng.choice(allowed, input_len - prefix_len).tolist() for _ in range(n)]
    texts = _dataset_prompts(workload)
    if not texts:
        raise ValueError(f"workload.path: {workload.path} holds no prompts")
    prompts = []
    for i in range(n):  # cycle through the dataset when it is shorter than the run
        item = texts[i % len(texts)]
        ids = list(item) if isinstance(item, list) else tok.encode(item)
        prompts.append(ids[:input_len])
    return prompts


def text_prompts(tok: Tokenizer, prompts: list[list[int]]) -> tuple[list[list[int]], list[str]]:
    """Timing prompts for a server that takes text only. Random token ids rarely survive decode ->
    encode (neighbouring tokens merge), so each prompt becomes the ids its own text tokenizes to, cut
    or topped up (with those ids again) to its length, until text and ids agree: the server then gets
    prompts of the length the matrix asked for, as far as its tokenizer agrees with this one."""
    ids_out, texts = [], []
    for ids in prompts:
        n, cur = len(ids), list(ids)
        for _ in range(8):
            back = tok.encode(tok.decode(cur))
            if back == cur:
                break
            cur = (back * (n // max(len(back), 1) + 1))[:n]
        text = tok.decode(cur)
        ids_out.append(tok.encode(text))
        texts.append(text)
    return ids_out, texts


def _dataset_prompts(workload: DatasetWorkload) -> list:
    text = Path(workload.path).read_text()
    if workload.kind == "text":
        return [line for line in text.splitlines() if line.strip()]
    items = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        record = json.loads(line)
        if workload.field not in record:
            raise ValueError(f"workload.path: line {lineno} of {workload.path} has no field '{workload.field}'")
        items.append(record[workload.field])
    return items
