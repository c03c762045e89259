"""Chat workloads: conversations rendered by the model's own chat template into token ids.

The driver renders every request's messages with transformers' `apply_chat_template` (with the
generation prompt) on the group's tokenizer, so offline and stream cells of every engine get the same
ids; serve cells send the messages themselves to /v1/chat/completions, and the server renders them
with its copy of the template (adapters/worker/served_cells.py compares its token counts with these ids).
"""

from __future__ import annotations

from pathlib import Path

from adapters.contract.tokenizer import chat_template

Message = dict[str, str]


class NoChatTemplate(ValueError):
    """The model's tokenizer has no chat template: its chat cells are `unsupported` with this reason."""


def has_local_template(tokenizer_source: str) -> bool | None:
    """Whether a local tokenizer (dir, or a file beside one) declares a chat template; None when the source
    is not local (a hub id: only the node that fetches it can tell)."""
    path = Path(tokenizer_source)
    if not path.exists():
        return None
    return chat_template(path) is not None


class ChatRenderer:
    """Messages -> prompt ids through the tokenizer's chat template (transformers, loaded once)."""

    def __init__(self, source: str, trust_remote_code: bool = False):
        from transformers import AutoTokenizer

        if Path(source).is_file():   # a .gguf: its tokenizer dir beside it, as adapters.contract.tokenizer reads it
            source = str(Path(source).parent)
        self._tok = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
        if not self._tok.chat_template:
            raise NoChatTemplate(f"workload.chat: the model's tokenizer ({source}) has no chat template, so its "
                                 "conversations cannot be rendered as chat (drop workload.chat to send them as "
                                 "'User: ...' text)")
        self.source = source

    def ids(self, messages: list[Message]) -> list[int]:
        # the template adds whatever special tokens the model wants: no BOS of the tokenizer's own on top
        text = self._tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(self._tok.encode(text, add_special_tokens=False))
