"""The model's tokenizer, the same on both sides of the boundary: the driver makes every prompt's ids
with it, and lm-eval tasks encode with it inside the engine process, so every engine sees the same ids.
`tokenizers` on a local tokenizer.json, else transformers' AutoTokenizer (hub ids, other formats)."""

from __future__ import annotations

import json
from pathlib import Path


class Tokenizer:
    def __init__(self, source: str, trust_remote_code: bool = False):
        path = Path(source)
        if path.is_file():  # a .gguf file has no tokenizer.json next to it by convention
            path = path.parent
        if (path / "tokenizer.json").exists():
            from tokenizers import Tokenizer as FastTokenizer

            tok = FastTokenizer.from_file(str(path / "tokenizer.json"))
            self.encode = lambda text: tok.encode(text, add_special_tokens=False).ids
            # transformers' fast tokenizers add what tokenizer.json's post-processor adds
            self.encode_default = lambda text: tok.encode(text, add_special_tokens=True).ids
            self.decode = lambda ids, skip_special_tokens=False: tok.decode(list(ids), skip_special_tokens=skip_special_tokens)
            self.vocab_size = tok.get_vocab_size()
            self.special_ids = set(tok.get_added_tokens_decoder())
            self.eos_id = _special_id(path, "eos_token", tok.token_to_id)
            self.bos_id = _special_id(path, "bos_token", tok.token_to_id)
        else:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
            self.encode = lambda text: tok.encode(text, add_special_tokens=False)
            self.encode_default = lambda text: tok.encode(text)
            self.decode = lambda ids, skip_special_tokens=False: tok.decode(list(ids), skip_special_tokens=skip_special_tokens)
            self.vocab_size = len(tok)
            self.special_ids = set(tok.all_special_ids)
            self.eos_id = tok.eos_token_id
            self.bos_id = tok.bos_token_id

    @property
    def prefix_id(self) -> int | None:
        """What lm-eval's HF backend conditions on where a text has no context of its own (a rolling
        window's first token, an empty context): BOS, else EOS (its `prefix_token_id`)."""
        return self.bos_id if self.bos_id is not None else self.eos_id

    def encode_task(self, text: str) -> list[int]:
        """A task text's ids as lm-eval's HF backend makes them (`tok_encode`): with the special tokens the
        tokenizer adds by default (BOS where it adds one), none where the text already starts with BOS's text."""
        bos = self.decode([self.prefix_id]) if self.prefix_id is not None else ""
        return self.encode(text) if bos and text.startswith(bos) else self.encode_default(text)

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """(context ids, continuation ids) as lm-eval's `loglikelihood` splits them: trailing spaces of the
        context move to the continuation; the context's own ids, then the rest of the whole text's ids (a
        token spanning the boundary is scored as part of the continuation); an empty context is the prefix
        token. tests/unit/test_task_encoding.py pins this against lm-eval's own code."""
        if not context:
            cont = self.encode(continuation)
            return ([self.prefix_id], cont) if not cont or cont[0] != self.prefix_id else (cont[:1], cont[1:])
        n_space = len(context) - len(context.rstrip())
        if n_space:
            context, continuation = context[:-n_space], context[-n_space:] + continuation
        ctx = self.encode_task(context)
        return ctx, self.encode_task(context + continuation)[len(ctx):]

    def cut(self, ids: list[int], stops: list[str]) -> str:
        """Generated ids as the text lm-eval's HF backend returns for a greedy generation: up to EOS,
        decoded without special tokens, then up to the first stop string (for greedy decoding, what
        stopping there would have produced)."""
        if self.eos_id is not None and self.eos_id in ids:
            ids = ids[:ids.index(self.eos_id)]
        text = self.decode(ids, skip_special_tokens=True)
        for stop in stops:
            if stop:
                text = text.split(stop)[0]
        return text


def chat_template(tokenizer_dir: str | Path) -> str | None:
    """The default chat template a local tokenizer dir declares, where transformers looks for it:
    tokenizer_config.json's `chat_template` (a string, or a list of named ones: "default"), else
    chat_template.jinja (transformers 5 saves it there), else chat_template.json. None: it has none."""
    path = Path(tokenizer_dir)
    if path.is_file():
        path = path.parent
    config = path / "tokenizer_config.json"
    found = json.loads(config.read_text()).get("chat_template") if config.is_file() else None
    if isinstance(found, list):
        found = next((t.get("template") for t in found if isinstance(t, dict) and t.get("name") == "default"), None)
    if not found and (path / "chat_template.jinja").is_file():
        found = (path / "chat_template.jinja").read_text()
    if not found and (path / "chat_template.json").is_file():
        found = json.loads((path / "chat_template.json").read_text()).get("chat_template")
    return found if isinstance(found, str) and found else None


def _special_id(path: Path, key: str, token_to_id) -> int | None:
    """The id of a special token (`bos_token`, `eos_token`) a tokenizer.json alone does not name: from
    tokenizer_config.json, else the model's generation_config.json / config.json (`<key>_id`)."""
    config = path / "tokenizer_config.json"
    if config.exists():
        tok = json.loads(config.read_text()).get(key)
        tok = tok.get("content") if isinstance(tok, dict) else tok
        if isinstance(tok, str) and token_to_id(tok) is not None:
            return token_to_id(tok)
    for name in ("generation_config.json", "config.json"):
        if (path / name).exists():
            found = json.loads((path / name).read_text()).get(f"{key}_id")
            if isinstance(found, list):
                found = found[0] if found else None
            if isinstance(found, int):
                return found
    return None
