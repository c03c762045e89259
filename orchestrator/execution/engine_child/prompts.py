"""Prompts as token ids, made once per group on the node and handed to the engine as ids.

Every engine of a model gets the same ids (never re-tokenized text), so their logprobs compare
position by position.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from adapters.contract.tokenizer import Tokenizer
from orchestrator.inputs import datasets, hf_datasets, lengths, traces
from orchestrator.inputs.chat import ChatRenderer
from orchestrator.inputs.tiny_model import eval_text
from orchestrator.matrix.models import HfWorkload, Measure, ShareGptWorkload, SyntheticWorkload, TraceWorkload, Workload


def scoring_prompts(measure: Measure, tok: Tokenizer) -> list[list[int]]:
    """Consecutive chunks of the scoring text, `scoring_len` tokens each."""
    text = eval_text() if measure.scoring_text == "builtin" else Path(measure.scoring_text).read_text()
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
    messages: list[list[dict]] | None = None   # chat workloads: each prompt's messages (prompts: their template ids)
    gaps_s: list[float] | None = None          # a trace: seconds before each request (its own schedule)


def timing_prompts(workload: Workload, tok: Tokenizer, n: int, input_len: int) -> list[list[int]]:
    """n prompts of input_len tokens (the fixed-length view of `timing_requests`)."""
    return timing_requests(workload, tok, n, input_len, 1, "offline").prompts


def timing_requests(workload: Workload, tok: Tokenizer, n: int, input_len: int, output_len: int,
                    mode: str, chat: ChatRenderer | None = None) -> Requests:
    """n requests. Request i is the same for every batch size and engine of a run (and of a mode: only
    the order of multi-turn conversations differs, see `_sessions`). A chat workload needs `chat`, the
    model's template."""
    if isinstance(workload, SyntheticWorkload):
        return _synthetic(workload, tok, n, input_len, output_len)
    if isinstance(workload, TraceWorkload):
        return _trace(workload, tok, n, input_len, output_len, mode)
    if isinstance(workload, ShareGptWorkload) or (isinstance(workload, HfWorkload) and workload.messages_field):
        return _sharegpt(workload, tok, n, input_len, output_len, mode, chat)
    if isinstance(workload, HfWorkload):
        items = hf_datasets.items(workload)
    elif workload.kind == "text":
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


def _trace(w: TraceWorkload, tok: Tokenizer, n: int, input_len: int, output_len: int, mode: str) -> Requests:
    """A trace's requests in its order (cycled where the run needs more), lengths capped at the axes, and
    the gaps between them, scaled (replayed by serve and stream cells; offline rows say they are not)."""
    trace = traces.read_trace(w.path)
    records = trace.records
    allowed = np.array([i for i in range(tok.vocab_size) if i not in tok.special_ids])
    prompts, short = traces.prompts(records, n, allowed, w.block_size, w.seed, input_len)
    outs = [min(records[i % len(records)].output_length, output_len) for i in range(n)]
    req = Requests(prompts, outs, gaps_s=traces.gaps_s(records, n, w.time_scale))
    shared = len({h for r in records for h in r.hash_ids}), sum(len(r.hash_ids) for r in records)
    span = (records[-1].timestamp - records[0].timestamp) / 1e3 * w.time_scale
    req.notes.append(
        f"trace: {len(records)} requests over {span:.3g} s (time_scale {w.time_scale:g}"
        + (f"; cycled to {n} requests" if n > len(records) else "") + f"); {shared[0]} distinct blocks of "
        f"{w.block_size} tokens in {shared[1]} block uses"
        + (f" (a BurstGPT log: no prefix sharing; {trace.dropped} failed rows with 0 tokens dropped)"
           if trace.shape == "burstgpt" else "") + f"; prompt lengths {lengths.describe([len(p) for p in prompts])}"
        f" (capped at input_len {input_len}), output lengths {lengths.describe(outs)} (capped at output_len "
        f"{output_len})" + (f"; {short} requests' blocks were shorter than their input_length (topped up with "
                            "tokens of their own)" if short else ""))
    if mode == "offline":   # never a replay in name only
        req.notes.append("trace times not replayed: offline cells run its requests as static batches (serve and "
                         "stream cells send each at its time)")
    return req


_LABELS = {"system": "System: ", "user": "User: ", "assistant": "Assistant: "}


def _sessions(w, tok: Tokenizer, input_len: int, output_len: int, chat: ChatRenderer | None) -> tuple[list, int]:
    """Per conversation, its requests as (prompt ids, output length, messages or None). Without chat,
    turns are rendered as 'Role: text\n' and encoded piece by piece, so turn k+1's prompt starts with
    turn k's prompt and reply, token for token: what a prefix cache can reuse. With chat, turn k+1's
    messages are turn k's + the reply + the next question, rendered whole by the model's template.
    Returns the sessions and the turns dropped because they would not fit input_len."""
    convs = hf_datasets.conversations(w) if isinstance(w, HfWorkload) else datasets.read_sharegpt(w.path)
    order = np.random.default_rng(w.seed).permutation(len(convs)).tolist()
    sessions, dropped = [], 0
    for c in order:
        turns, context, session, messages = convs[c], [], [], []
        users = [i for i, (role, _) in enumerate(turns) if role == "user"]
        users = users[: (w.max_turns or len(users)) if w.multi_turn else 1]
        pos, prompt = 0, None
        for u in users:
            for j, (role, text) in enumerate(turns[pos:u + 1], pos):
                messages.append({"role": role, "content": text})
                if chat:
                    continue
                if prompt is not None and j == pos and role == "assistant":   # the reply after the last prompt
                    context = prompt + tok.encode(text + "\n")
                else:
                    context = context + tok.encode(_LABELS[role] + text + "\n")
            pos = u + 1
            reply = turns[pos][1] if pos < len(turns) and turns[pos][0] == "assistant" else None
            prompt = chat.ids(messages) if chat else context + tok.encode(_LABELS["assistant"])
            if len(prompt) > input_len:
                dropped += len(users) - len(session)
                break
            out = min(output_len, max(1, len(tok.encode(reply)))) if reply is not None else output_len
            session.append((prompt, out, list(messages) if chat else None))
        if session:
            sessions.append(session)
    if not sessions:
        where = "workload.name" if isinstance(w, HfWorkload) else "workload.path"
        raise ValueError(f"{where}: no conversation of {getattr(w, 'name', None) or w.path} has a first turn "
                         f"within input_len {input_len}")
    return sessions, dropped


def _chat_note(chat: ChatRenderer, sessions: list) -> str:
    """How the template renders multi-turn context: does turn k+1 extend turn k's ids (what a prefix cache
    reuses)? A template may re-render earlier turns (e.g. drop reasoning), and then it does not."""
    pairs = [(a[0], b[0]) for s in sessions for a, b in zip(s, s[1:])]
    extend = sum(b[:len(a)] == a for a, b in pairs)
    return ("chat: messages rendered with the model's chat template, generation prompt added"
            + (f"; {extend} of {len(pairs)} later turns start with the previous turn's prompt ids" if pairs else ""))


def _sharegpt(w, tok: Tokenizer, n: int, input_len: int, output_len: int, mode: str,
              chat: ChatRenderer | None) -> Requests:
    if w.chat and chat is None:
        raise ValueError("a chat workload needs the model's chat template (timing_requests(..., chat=...))")
    sessions, dropped = _sessions(w, tok, input_len, output_len, chat if w.chat else None)
    multi = w.multi_turn and mode == "serve"
    if multi:   # conversation by conversation: each turn right after the one it follows
        flat = [(p, o, int(t > 0), m) for s in sessions for t, (p, o, m) in enumerate(s)]
    else:       # turn by turn (every first turn, then every second ...): later turns come in later batches
        most = max(len(s) for s in sessions)
        flat = [(*s[t][:2], 0, s[t][2]) for t in range(most) for s in sessions if t < len(s)]
    picked = [flat[i % len(flat)] for i in range(n)]
    follows = [f if i % len(flat) else 0 for i, (_, _, f, _) in enumerate(picked)]
    req = Requests([p for p, _, _, _ in picked], [o for _, o, _, _ in picked], follows if multi else None,
                   w.think_time_s if multi else 0.0, messages=[m for *_, m in picked] if w.chat else None)
    turns = [len(s) for s in sessions]
    req.notes.append(f"{w.kind}: {len(sessions)} conversations, {sum(turns)} requests ({'multi-turn' if w.multi_turn else 'first turns'}"
                     f"{'' if multi or not w.multi_turn else ', sent turn by turn without waits outside serve cells'}), "
                     f"turns per conversation {min(turns)}-{max(turns)}; prompt lengths "
                     f"{lengths.describe([len(p) for p in req.prompts])}; output lengths "
                     f"{lengths.describe(req.output_lens)}" + (f"; {dropped} turns dropped beyond input_len {input_len}"
                                                               if dropped else ""))
    if w.chat:
        req.notes.append(_chat_note(chat, sessions))
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
