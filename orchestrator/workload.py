"""Prompts as token ids, made once per group on the node and handed to the engine as ids.

Every engine of a model gets the same ids (never re-tokenized text), so their logprobs compare
position by position.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from adapters.tokenizer import Tokenizer
from orchestrator import datasets, lengths
from orchestrator.matrix import Measure, ShareGptWorkload, SyntheticWorkload, Workload


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


@dataclass
class Requests:
    """The timing requests of one cell, in the order they are sent: prompt ids, each one's output length
    (None: the cell's output_len for all), and for multi-turn serve cells which earlier request each one
    follows (follows[i] = k > 0: request i is sent think_time_s after request i - k has ended)."""

    prompts: list[list[int]]
    output_lens: list[int] | None = None
    follows: list[int] | None = None
    think_time_s: float = 0.0
    notes: list[str] = field(default_factory=list)


def timing_prompts(workload: Workload, tok: Tokenizer, n: int, input_len: int) -> list[list[int]]:
    """n prompts of input_len tokens (the fixed-length view of `timing_requests`)."""
    return timing_requests(workload, tok, n, input_len, 1, "offline").prompts


def timing_requests(workload: Workload, tok: Tokenizer, n: int, input_len: int, output_len: int,
                    mode: str) -> Requests:
    """n requests. Request i is the same for every batch size and engine of a run (and of a mode: only
    the order of multi-turn conversations differs, see `_sessions`)."""
    if isinstance(workload, SyntheticWorkload):
        return _synthetic(workload, tok, n, input_len, output_len)
    if isinstance(workload, ShareGptWorkload):
        return _sharegpt(workload, tok, n, input_len, output_len, mode)
    if workload.kind == "text":
        items = [(t, None) for t in datasets.read_text(workload.path)]
    else:
        items = datasets.read_jsonl(workload.path, workload.field, workload.output_field)
    prompts, outs = [], []
    for i in range(n):  # cycle through the dataset when it is shorter than the run
        prompt, ref = items[i % len(items)]
        ids = list(prompt) if isinstance(prompt, list) else tok.encode(prompt)
        prompts.append(ids[:input_len])
        outs.append(min(output_len, max(1, len(tok.encode(ref)))) if ref is not None else output_len)
    req = Requests(prompts, outs if workload.output_field else None)
    if workload.output_field:
        req.notes.append(f"output lengths from the references ({workload.output_field}, capped at {output_len}): "
                         f"{lengths.describe(outs)}")
    return req


def _synthetic(w: SyntheticWorkload, tok: Tokenizer, n: int, input_len: int, output_len: int) -> Requests:
    rng = np.random.default_rng([w.seed, input_len])
    allowed = np.array([i for i in range(tok.vocab_size) if i not in tok.special_ids])
    in_lens = lengths.sample(w.input_lengths, n, [w.seed, 1]) if w.input_lengths else [input_len] * n
    out_lens = lengths.sample(w.output_lengths, n, [w.seed, 2]) if w.output_lengths else None
    # the first prefix and the suffixes are drawn as before prefix groups existed: the same prompts
    prefixes = [rng.choice(allowed, min(w.shared_prefix_len, input_len)).tolist() for _ in range(w.prefix_groups)]
    groups = (np.random.default_rng([w.seed, input_len, 1]).integers(0, w.prefix_groups, n).tolist()
              if w.prefix_groups > 1 else [0] * n)
    prompts = []
    for length, g in zip(in_lens, groups):
        prefix = prefixes[g][:length]
        prompts.append(prefix + rng.choice(allowed, length - len(prefix)).tolist())
    req = Requests(prompts, out_lens)
    if w.input_lengths:
        req.notes.append(f"input lengths drawn ({w.input_lengths.kind}): {lengths.describe(in_lens)}")
    if w.output_lengths:
        req.notes.append(f"output lengths drawn ({w.output_lengths.kind}): {lengths.describe(out_lens)}")
    if w.prefix_groups > 1:
        req.notes.append(f"{w.prefix_groups} prefix groups of {w.shared_prefix_len} tokens, "
                         f"requests per group: {np.bincount(groups, minlength=w.prefix_groups).tolist()}")
    return req


_LABELS = {"system": "System: ", "user": "User: ", "assistant": "Assistant: "}


def _sessions(w: ShareGptWorkload, tok: Tokenizer, input_len: int, output_len: int) -> tuple[list, int]:
    """Per conversation, its requests as (prompt ids, output length). Turns are rendered as 'Role: text\n'
    (no chat template) and encoded piece by piece, so turn k+1's prompt starts with turn k's prompt and
    reply, token for token: what a prefix cache can reuse. Returns the sessions and the turns dropped
    because they would not fit input_len."""
    convs = datasets.read_sharegpt(w.path)
    order = np.random.default_rng(w.seed).permutation(len(convs)).tolist()
    sessions, dropped = [], 0
    for c in order:
        turns, context, session = convs[c], [], []
        users = [i for i, (role, _) in enumerate(turns) if role == "user"]
        users = users[: (w.max_turns or len(users)) if w.multi_turn else 1]
        pos, prompt = 0, None
        for u in users:
            for j, (role, text) in enumerate(turns[pos:u + 1], pos):
                if prompt is not None and j == pos and role == "assistant":   # the reply after the last prompt
                    context = prompt + tok.encode(text + "\n")
                else:
                    context = context + tok.encode(_LABELS[role] + text + "\n")
            pos = u + 1
            reply = turns[pos][1] if pos < len(turns) and turns[pos][0] == "assistant" else None
            prompt = context + tok.encode(_LABELS["assistant"])
            if len(prompt) > input_len:
                dropped += len(users) - len(session)
                break
            out = min(output_len, max(1, len(tok.encode(reply)))) if reply is not None else output_len
            session.append((prompt, out))
        if session:
            sessions.append(session)
    if not sessions:
        raise ValueError(f"workload.path: no conversation of {w.path} has a first turn within input_len {input_len}")
    return sessions, dropped


def _sharegpt(w: ShareGptWorkload, tok: Tokenizer, n: int, input_len: int, output_len: int, mode: str) -> Requests:
    sessions, dropped = _sessions(w, tok, input_len, output_len)
    multi = w.multi_turn and mode == "serve"
    if multi:   # conversation by conversation: each turn right after the one it follows
        flat = [(p, o, int(t > 0)) for s in sessions for t, (p, o) in enumerate(s)]
    else:       # turn by turn (every first turn, then every second ...): later turns come in later batches
        most = max(len(s) for s in sessions)
        flat = [(s[t][0], s[t][1], 0) for t in range(most) for s in sessions if t < len(s)]
    picked = [flat[i % len(flat)] for i in range(n)]
    follows = [f if i % len(flat) else 0 for i, (_, _, f) in enumerate(picked)]
    req = Requests([p for p, _, _ in picked], [o for _, o, _ in picked], follows if multi else None,
                   w.think_time_s if multi else 0.0)
    turns = [len(s) for s in sessions]
    req.notes.append(f"sharegpt: {len(sessions)} conversations, {sum(turns)} requests ({'multi-turn' if w.multi_turn else 'first turns'}"
                     f"{'' if multi or not w.multi_turn else ', sent turn by turn without waits outside serve cells'}), "
                     f"turns per conversation {min(turns)}-{max(turns)}; prompt lengths "
                     f"{lengths.describe([len(p) for p in req.prompts])}; output lengths "
                     f"{lengths.describe(req.output_lens)}" + (f"; {dropped} turns dropped beyond input_len {input_len}"
                                                               if dropped else ""))
    return req


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
