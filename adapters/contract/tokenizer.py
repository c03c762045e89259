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
            self.decode = lambda ids: tok.decode(list(ids), skip_special_tokens=False)
            self.vocab_size = tok.get_vocab_size()
            self.special_ids = set(tok.get_added_tokens_decoder())
            self.eos_id = _eos_id(path, tok.token_to_id)
        else:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
            self.encode = lambda text: tok.encode(text, add_special_tokens=False)
            self.decode = lambda ids: tok.decode(list(ids), skip_special_tokens=False)
            self.vocab_size = len(tok)
            self.special_ids = set(tok.all_special_ids)
            self.eos_id = tok.eos_token_id

    def cut(self, ids: list[int], stops: list[str]) -> str:
        """Generated ids as the text a stopping decoder would have returned: up to EOS, then up to the
        first stop string (for greedy decoding, what stopping there would have produced)."""
        if self.eos_id is not None and self.eos_id in ids:
            ids = ids[:ids.index(self.eos_id)]
        text = self.decode(ids)
        for stop in stops:
            if stop and stop in text:
                text = text[:text.index(stop)]
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


def _eos_id(path: Path, token_to_id) -> int | None:
    """The EOS id a tokenizer.json alone does not name: from tokenizer_config.json, else the model's
    generation_config.json / config.json."""
    config = path / "tokenizer_config.json"
    if config.exists():
        eos = json.loads(config.read_text()).get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
        if isinstance(eos, str) and token_to_id(eos) is not None:
            return token_to_id(eos)
    for name in ("generation_config.json", "config.json"):
        if (path / name).exists():
            eos = json.loads((path / name).read_text()).get("eos_token_id")
            if isinstance(eos, list):
                eos = eos[0] if eos else None
            if isinstance(eos, int):
                return eos
    return None
