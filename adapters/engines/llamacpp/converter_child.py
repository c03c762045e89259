"""llama.cpp's own HF -> GGUF converter, run in a child process by `adapters.engines.llamacpp.gguf_convert`.

The converter is `convert_hf_to_gguf.py` with its `conversion/` package and its own `gguf-py`, unpacked
from the source distribution of the pinned llama-cpp-python (the Makefile's `llama-cpp-src` target), so
the GGUF is written by the same llama.cpp revision that runs it. This file runs by path in the llama.cpp
environment and imports nothing of the project: the converter's directory goes first on sys.path, so its
bundled gguf-py (not the environment's `gguf` package) is the one it writes with.

Two changes to the converter's behaviour, both about the tokenizer:
- a BPE tokenizer whose pre-tokenizer the converter does not recognise by hash
  (`TextModel.get_vocab_base_pre` raises NotImplementedError) gets the pre-tokenizer name the caller passes
  as the last argument, and the report says so; without that argument the converter's error stands;
- a checkpoint whose tokenizer_config.json declares the generic `PreTrainedTokenizerFast` (tokenizer.json is
  the whole tokenizer), or GPT2Tokenizer beside a tokenizer.json, is loaded as PreTrainedTokenizerFast where the
  converter asks AutoTokenizer. transformers 5 swaps
  in the model type's own class instead (Qwen2Tokenizer for a qwen2 config), which adds its default special
  tokens (`<|endoftext|>` as a 513th token on the built-in tiny-qwen2's 512-row embedding) and fails the
  converter's vocabulary-size assertion. The project reads tokenizer.json the same way
  (adapters/contract/tokenizer.py).

argv: CONVERTER_DIR MODEL_DIR OUTFILE OUTTYPE REPORT_JSON [TOKENIZER_PRE]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    src, model_dir, outfile, outtype, report = argv[:5]
    fallback_pre = argv[5] if len(argv) > 5 else ""
    sys.path[:0] = [src, str(Path(src) / "gguf-py")]

    import convert_hf_to_gguf as cli   # noqa: E402 (the path above decides which gguf it imports)
    from conversion import base

    used = {"tokenizer_pre_source": "none"}
    recognise = base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer) -> str:
        try:
            pre = recognise(self, tokenizer)
            used["tokenizer_pre_source"] = "hash"
            return pre
        except NotImplementedError:
            if not fallback_pre:
                raise
            used["tokenizer_pre_source"] = "given"
            return fallback_pre

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre
    _declared_class_for_auto_tokenizer(Path(model_dir))
    sys.argv = ["convert_hf_to_gguf.py", model_dir, "--outtype", outtype, "--outfile", outfile]
    cli.main()
    import gguf
    Path(report).write_text(json.dumps({**used, "gguf_py": str(Path(gguf.__file__).parent.parent.name)}))
    return 0


# declared classes loaded from tokenizer.json alone: the generic one, and GPT2Tokenizer, which transformers 4.57 (the
# converter's environment) builds with GPT-2's default <|endoftext|> added when the vocabulary lacks it (a 513th
# token on the built-in tiny vocabulary: the converter's vocabulary-size assertion fails)
DECLARED_FROM_TOKENIZER_JSON = ("PreTrainedTokenizerFast", "GPT2Tokenizer")


def _declared_class_for_auto_tokenizer(model_dir: Path) -> None:
    config = model_dir / "tokenizer_config.json"
    if not config.is_file() or not (model_dir / "tokenizer.json").is_file():
        return
    if json.loads(config.read_text()).get("tokenizer_class") not in DECLARED_FROM_TOKENIZER_JSON:
        return
    import transformers

    auto = transformers.AutoTokenizer.from_pretrained

    def from_pretrained(path, *args, **kwargs):
        if Path(path).resolve() == model_dir.resolve():
            return transformers.PreTrainedTokenizerFast.from_pretrained(path, **kwargs)
        return auto(path, *args, **kwargs)

    transformers.AutoTokenizer.from_pretrained = from_pretrained


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
