"""Local dataset files as conversations: ShareGPT-style JSON, JSONL prompts (with optional reference
outputs) and plain text, read the same way by `bench validate` (does it exist and parse?) and by the
run (the prompts).

A conversation is a list of (role, text) turns, roles "system", "user", "assistant". ShareGPT files
are a JSON list (or JSONL) of records with `conversations: [{from, value}]` (from: human/user, gpt/
assistant/chatgpt/bing/bard, system) or OpenAI-style `messages: [{role, content}]`.
"""

from __future__ import annotations

import json
from pathlib import Path

Turn = tuple[str, str]
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
          "bing": "assistant", "bard": "assistant", "model": "assistant", "system": "system"}


class DatasetError(ValueError):
    """A dataset file that cannot be read as the workload says: the message names the file and the place."""


def _records(path: Path) -> list:
    text = path.read_text()
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise DatasetError(f"{path}: not valid JSON ({err})") from None
        return data
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise DatasetError(f"{path}: line {lineno} is not valid JSON ({err})") from None
    return out


def _conversation(turns, where: str) -> list[Turn]:
    """One record's turns (ShareGPT {from, value} or OpenAI {role, content}) as (role, text)."""
    if not isinstance(turns, list):
        raise DatasetError(f"{where} has no 'conversations' (ShareGPT) or 'messages' (OpenAI) list")
    conv = []
    for j, t in enumerate(turns):
        who = t.get("from", t.get("role")) if isinstance(t, dict) else None
        text = t.get("value", t.get("content")) if isinstance(t, dict) else None
        if who not in _ROLES or not isinstance(text, str):
            raise DatasetError(f"{where} turn {j} needs from/role in ({', '.join(sorted(_ROLES))}) "
                               "and a string value/content")
        conv.append((_ROLES[who], text))
    return conv


def conversations(records, source: str, field: str | None = None) -> list[list[Turn]]:
    """Every conversation with at least one user turn, its turns in order; `field` names the turns'
    list (default: `conversations`, else `messages`)."""
    convs = []
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise DatasetError(f"{source}: record {i} is not an object")
        turns = rec.get(field) if field else rec.get("conversations", rec.get("messages"))
        conv = _conversation(turns, f"{source}: record {i}" + (f" field '{field}'" if field else ""))
        if any(role == "user" for role, _ in conv):
            convs.append(conv)
    if not convs:
        raise DatasetError(f"{source}: no conversation with a user turn")
    return convs


def read_sharegpt(path: str | Path) -> list[list[Turn]]:
    """Every conversation with at least one user turn, its turns in order."""
    return conversations(_records(Path(path)), str(path))


def prompt_item(rec, field: str, output_field: str | None, where: str) -> tuple[object, str | None]:
    if not isinstance(rec, dict) or field not in rec:
        raise DatasetError(f"{where} has no field '{field}'")
    prompt = rec[field]
    if not (isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(x, int) for x in prompt))):
        raise DatasetError(f"{where}: '{field}' must be text or a list of token ids")
    ref = None
    if output_field:
        ref = rec.get(output_field)
        if not isinstance(ref, str):
            raise DatasetError(f"{where} has no text field '{output_field}' (the reference output)")
    return prompt, ref


def read_jsonl(path: str | Path, field: str, output_field: str | None = None) -> list[tuple[object, str | None]]:
    """(prompt, reference output or None) per line; the prompt is text or a list of token ids."""
    path = Path(path)
    items = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as err:
            raise DatasetError(f"{path}: line {lineno} is not valid JSON ({err})") from None
        prompt, ref = prompt_item(rec, field, output_field, f"{path}: line {lineno}")
        items.append((prompt, ref))
    if not items:
        raise DatasetError(f"{path}: holds no prompts")
    return items


def read_text(path: str | Path) -> list[str]:
    lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    if not lines:
        raise DatasetError(f"{path}: holds no prompts")
    return lines


def check(kind: str, path: str, field: str = "text", output_field: str | None = None) -> str | None:
    """Why the file cannot serve as this workload (None: it can), without a tokenizer."""
    p = Path(path)
    if not p.is_file():
        return f"{path}: no such file (mark it cluster_only: true if it exists only where the run happens)"
    try:
        if kind == "sharegpt":
            read_sharegpt(p)
        elif kind == "jsonl":
            read_jsonl(p, field, output_field)
        else:
            read_text(p)
    except (DatasetError, UnicodeDecodeError, OSError) as err:
        return str(err)
    return None
