"""llama.cpp's own interfaces as the llama.cpp adapter drives them (adapters/engines/llamacpp/adapter.py): the
GGML KV-cache types, a llama_batch over numpy buffers, model defaults llama-cpp-python does not
expose, GGUF readers, the sampler's seed range, and the entry point of its OpenAI-compatible server."""

from __future__ import annotations

import contextlib
import ctypes
import sys

import numpy as np

from adapters.base import Unsupported
from adapters.contract.records import TokenScores, topk_dense
from adapters.engines.llamacpp.gguf_convert import captured_llama_logs

# GGML_TYPE_* ids and bytes per element of the KV cache types (ggml.h; quantized types per 32-block)
KV_TYPES = {"f32": (0, 4.0), "f16": (1, 2.0), "bf16": (30, 2.0), "q8_0": (8, 34 / 32), "q5_1": (7, 24 / 32),
             "q5_0": (6, 22 / 32), "q4_1": (3, 20 / 32), "q4_0": (2, 18 / 32), "iq4_nl": (20, 18 / 32)}


FLASH_ATTN_TYPES = {"auto": -1, "off": 0, "on": 1}


CTX_ROUND = 256  # llama.cpp pads n_ctx (and n_ctx per sequence) to multiples of 256 anyway


def flash_attn_mode(value: str | bool) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return value


@contextlib.contextmanager
def llama_defaults(use_extra_bufts: bool, flash_attn_type: int):
    """Make llama_cpp.Llama(...) build its model with `use_extra_bufts` (which its constructor does not
    expose) and its context with the flash-attention mode auto/on/off (it only maps a bool)."""
    import llama_cpp.llama_cpp as lc

    orig_params, orig_disabled = lc.llama_model_default_params, lc.LLAMA_FLASH_ATTN_TYPE_DISABLED

    def model_params():
        params = orig_params()
        params.use_extra_bufts = use_extra_bufts
        return params

    lc.llama_model_default_params = model_params
    lc.LLAMA_FLASH_ATTN_TYPE_DISABLED = flash_attn_type  # Llama(flash_attn=False) writes this value
    try:
        yield
    finally:
        lc.llama_model_default_params, lc.LLAMA_FLASH_ATTN_TYPE_DISABLED = orig_params, orig_disabled


class Batch:
    """A llama_batch over numpy buffers we own: filled with vector writes, one seq id per token."""

    def __init__(self, llama_cpp, capacity: int):
        self.capacity = capacity
        self.token = np.zeros(capacity, np.int32)
        self.pos = np.zeros(capacity, np.int32)
        self.n_seq_id = np.ones(capacity, np.int32)
        self.seq = np.zeros(capacity, np.int32)
        self.logits = np.zeros(capacity, np.int8)
        i32p = ctypes.POINTER(ctypes.c_int32)
        self._seq_ptrs = (i32p * capacity)(*[ctypes.cast(self.seq.ctypes.data + 4 * i, i32p) for i in range(capacity)])
        b = llama_cpp.llama_batch()
        b.n_tokens = 0
        b.token = self.token.ctypes.data_as(i32p)
        b.embd = ctypes.POINTER(ctypes.c_float)()
        b.pos = self.pos.ctypes.data_as(i32p)
        b.n_seq_id = self.n_seq_id.ctypes.data_as(i32p)
        b.seq_id = ctypes.cast(self._seq_ptrs, ctypes.POINTER(i32p))
        b.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        self.struct = b

    def fill(self, tokens, pos, seq, out) -> None:
        n = len(tokens)
        self.token[:n], self.pos[:n], self.seq[:n], self.logits[:n] = tokens, pos, seq, out
        self.struct.n_tokens = n


def check_seed(seed: int) -> None:
    if not 0 <= int(seed) < 0xFFFFFFFF:
        raise Unsupported(f"llama.cpp sampler seeds are 32-bit and 0xFFFFFFFF means 'random': seed {seed} "
                          "is outside 0 .. 4294967294")


def sampled_scores(lp: np.ndarray, tokens: list[int]) -> TokenScores:
    return topk_dense(lp, np.asarray(tokens, np.int64), 0)


def last_error(logs: list[str]) -> str:
    text = "".join(logs).strip().splitlines()
    errs = [line for line in text if "error" in line.lower() or "failed" in line.lower()]
    return (errs or text or ["no log output"])[-1]


def tensor_types(path) -> dict[str, int]:
    import gguf

    counts: dict[str, int] = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return dict(sorted(counts.items()))


# llama.cpp architectures whose feed-forward runs ggml_gelu (GELU, or GEGLU for Gemma)
GELU_ARCHS = frozenset({"gpt2", "gptneox", "falcon", "bloom", "starcoder", "starcoder2", "phi2", "gemma", "gemma2",
                        "gemma3"})


def gelu_deviation(path) -> str | None:
    """The reason a GELU model's logits differ from an fp32 reference on a CPU whatever the conversion: ggml's CPU
    GELU rounds its input to f16 and reads an f16 table (GGML_GELU_FP16, a compile-time choice in ggml-cpu/vec.h);
    None for other architectures. Measured at fp32 with an f32 KV cache: 1e-4 to 2e-3 from transformers, 3-7x
    less with that rounding emulated in transformers (tests/engines/test_gguf_converter.py)."""
    import gguf

    field = gguf.GGUFReader(str(path)).fields.get("general.architecture")
    arch = bytes(field.parts[field.data[0]]).decode() if field is not None else None
    if arch not in GELU_ARCHS:
        return None
    return (f"engine property, not a conversion fault: llama.cpp's CPU GELU rounds to f16 ({arch} is a GELU "
            "model; about 1e-4 to 2e-3 in logprob at fp32)")


def gguf_head_dim(path) -> int | None:
    import gguf

    reader = gguf.GGUFReader(str(path))
    arch_field = reader.fields.get("general.architecture")
    if arch_field is None:
        return None
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode()

    def val(key):
        f = reader.fields.get(f"{arch}.{key}")
        return int(f.parts[f.data[0]][0]) if f is not None else None

    if val("attention.key_length"):
        return val("attention.key_length")
    emb, heads = val("embedding_length"), val("attention.head_count")
    return emb // heads if emb and heads else None


class VocabMap:
    """Token string -> token id, built from a GGUF's vocabulary exactly as llama-cpp-python's server
    renders tokens in logprobs (detokenize one id, decode UTF-8 ignoring errors). Strings shared by
    several ids are ambiguous (-1)."""

    def __init__(self, gguf_path) -> None:
        import llama_cpp

        with captured_llama_logs([]):
            llm = llama_cpp.Llama(str(gguf_path), vocab_only=True, verbose=False)
        ids: dict[str, list[int]] = {}
        for i in range(llm.n_vocab()):
            ids.setdefault(llm.detokenize([i]).decode("utf-8", errors="ignore"), []).append(i)
        llm.close()
        self.ids = {s: (v[0] if len(v) == 1 else -1) for s, v in ids.items()}
        self.ambiguous = sum(1 for v in ids.values() if len(v) > 1)

    def id(self, token: str) -> int:
        return self.ids.get(token, -1)


def serve_main(argv: list[str] | None = None) -> None:
    """llama-cpp-python's server with use_extra_bufts and the flash-attention mode set:
    `python -c 'from adapters.engines.llamacpp.native import serve_main; serve_main()' USE_EXTRA_BUFTS FLASH_ATTN -- ARGS`."""
    argv = sys.argv[1:] if argv is None else argv
    use_extra_bufts, flash = argv[0] == "True", argv[1]
    from llama_cpp.server.__main__ import main

    sys.argv = ["llama_cpp.server", *argv[3:]]
    # --flash_attn True selects "on"; False writes LLAMA_FLASH_ATTN_TYPE_DISABLED, which is set to auto's -1 or off's 0
    with llama_defaults(use_extra_bufts, FLASH_ATTN_TYPES[flash] if flash != "on" else FLASH_ATTN_TYPES["off"]):
        main()
