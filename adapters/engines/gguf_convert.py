"""HF checkpoint (safetensors + tokenizer.json) -> GGUF, and GGUF -> quantized GGUF, cached by content.

Written here (llama-cpp-python ships no converter) for the architectures llama.cpp runs with the plain
"llama" and "qwen2" graphs:

- LlamaForCausalLM / MistralForCausalLM -> GGUF arch "llama". llama.cpp's llama graph applies RoPE to
  interleaved pairs (rope type NORM) while HF rotates halves, so the Q and K rows (weights and, when
  present, biases) are permuted exactly as llama.cpp's convert_hf_to_gguf.py `LlamaModel.permute` does.
- Qwen2ForCausalLM -> GGUF arch "qwen2". Its graph uses NEOX RoPE (rotate-half, like HF), so
  convert_hf_to_gguf.py's `Qwen2Model` does *not* permute; Q/K/V biases are written as attn_*.bias.

Grouped-query attention (num_key_value_heads), an explicit head_dim, rope theta (transformers 4.x
`rope_theta` or 5.x `rope_parameters`), linear and llama3 RoPE scaling are carried over. Tied embeddings
(`tie_word_embeddings` with no lm_head) omit output.weight, as llama.cpp's converter does; llama.cpp then
uses token_embd for the output projection.

The tokenizer is written as a "gpt2" (byte-level BPE) vocabulary with token types, merges and the
bos/eos/pad ids, and `add_bos_token = add_eos_token = false`: the benchmark hands llama.cpp token ids,
and llama.cpp must never add a BOS of its own. The checkpoint's chat template (tokenizer_config.json or
chat_template.jinja) becomes `tokenizer.chat_template`, which llama-cpp-python's server renders chat
requests with when no chat_format is given (Llama.__init__; without one it falls back to "llama-2"). A BPE tokenizer with byte fallback (Llama-2 / Mistral-v0.1
style, tokens like "▁the" and "<0x0A>") is written as llama.cpp's "llama" (SentencePiece) vocabulary
instead, with byte tokens typed BYTE; either way only the ids matter to the benchmark.

Caching: the key is a SHA-256 over the checkpoint files that conversion reads (config.json,
tokenizer.json, tokenizer_config.json, chat_template.jinja, the safetensors files and their index), CONVERTER_VERSION and the
output type; quantized files add the quantization level and llama-cpp-python's version (the quantizer
belongs to the engine). Files are written to a temporary name in the cache directory and moved into place
with os.replace, so a crash never leaves a truncated GGUF under the final name and concurrent writers
race harmlessly.

A model given as a `.gguf` file is used as it is, never converted or re-quantized (a second
quantization would change what is measured): the quantization axis must be `gguf`, or the logical level
that matches the file's `general.file_type` (e.g. `q4_k_m` for a Q4_K_M file); anything else is
`Unsupported`. Conversely `gguf` on an HF checkpoint is `Unsupported` (there is no file to take as is).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import math
import os
import struct
import tempfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from adapters.base import Unsupported
from adapters.contract.tokenizer import chat_template
from adapters.meters.provenance import file_digest

CONVERTER_VERSION = "3"   # 3: the chat template goes in as tokenizer.chat_template

# HF `architectures[0]` (or config model_type) -> (GGUF architecture, permute Q/K for RoPE layout)
ARCHITECTURES: dict[str, tuple[str, bool]] = {
    "LlamaForCausalLM": ("llama", True),
    "MistralForCausalLM": ("llama", True),
    "Qwen2ForCausalLM": ("qwen2", False),
}
MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}

OUT_TYPES = ("f32", "f16", "bf16")
# logical quantization level -> llama.cpp LLAMA_FTYPE_* value (include/llama.h)
FTYPES: dict[str, int] = {
    "fp32": 0, "fp16": 1, "bf16": 32,
    "q8_0": 7, "q6_k": 18, "q5_k_m": 17, "q4_k_m": 15, "q4_0": 2,
}
QUANT_LEVELS = ("q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0")
LEVEL_OUT_TYPE = {"fp32": "f32", "fp16": "f16", "bf16": "bf16"}

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64}


# ----------------------------------------------------------------------------------------------
# reading the checkpoint

def _supported_list() -> str:
    return ", ".join(sorted(ARCHITECTURES))


def read_config(model_dir: Path) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise Unsupported(f"gguf conversion needs an HF checkpoint directory with config.json; {model_dir} has none")
    return json.loads(path.read_text())


def architecture_of(config: dict[str, Any]) -> tuple[str, str, bool]:
    """(HF architecture, GGUF architecture, permute Q/K) or Unsupported."""
    archs = config.get("architectures") or []
    hf_arch = archs[0] if archs else MODEL_TYPES.get(config.get("model_type", ""), config.get("model_type", "?"))
    if hf_arch not in ARCHITECTURES:
        raise Unsupported(f"gguf conversion does not support architecture {hf_arch} (supported: {_supported_list()})")
    gguf_arch, permute = ARCHITECTURES[hf_arch]
    return hf_arch, gguf_arch, permute


def _safetensors_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / n for n in names]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise Unsupported(f"gguf conversion needs *.safetensors weights; {model_dir} has none")
    return files


def _read_safetensors(path: Path) -> Iterator[tuple[str, np.ndarray]]:
    """Tensors of one safetensors file as float32 arrays (memory-mapped reads; bf16 widened exactly)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    base = 8 + n
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype = meta["dtype"]
        if dtype not in _ST_DTYPES:
            raise Unsupported(f"gguf conversion does not read safetensors dtype {dtype} (tensor {name}); "
                              "quantized checkpoints are not converted")
        begin, end = meta["data_offsets"]
        buf = raw[base + begin: base + end].view(_ST_DTYPES[dtype]).reshape(meta["shape"])
        if dtype == "BF16":
            arr = (buf.astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.asarray(buf, dtype=np.float32)
        yield name, arr


def checkpoint_files(model_dir: Path) -> list[Path]:
    model_dir = Path(model_dir)
    files = [model_dir / "config.json", model_dir / "tokenizer.json"]
    for extra in ("tokenizer_config.json", "chat_template.jinja", "chat_template.json", "model.safetensors.index.json"):
        if (model_dir / extra).is_file():
            files.append(model_dir / extra)
    return files + _safetensors_files(model_dir)


def checkpoint_hash(model_dir: Path) -> str:
    """SHA-256 over the names and content digests of every file conversion reads (the digests are
    adapters.meters.provenance's, the one file hash of the project)."""
    h = hashlib.sha256()
    for path in checkpoint_files(Path(model_dir)):
        if not path.is_file():
            raise Unsupported(f"gguf conversion needs {path.name} in {model_dir}")
        h.update(path.name.encode() + b"\0" + file_digest(path).encode() + b"\n")
    return h.hexdigest()


# ----------------------------------------------------------------------------------------------
# hyperparameters

def _rope(config: dict[str, Any]) -> dict[str, Any]:
    """RoPE parameters across transformers 4.x (rope_theta + rope_scaling) and 5.x (rope_parameters)."""
    params = dict(config.get("rope_parameters") or {})
    scaling = config.get("rope_scaling") or {}
    for k, v in scaling.items():
        params.setdefault(k, v)
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params["type"]
    params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    params.setdefault("rope_type", "default")
    return params


def _head_dim(config: dict[str, Any]) -> int:
    return int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])


def _llama3_rope_factors(rope: dict[str, Any], dim: int) -> np.ndarray:
    # same arithmetic as llama.cpp's convert_hf_to_gguf.py LlamaModel.generate_extra_tensors
    base = rope.get("rope_theta", 10000.0)
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor = rope.get("factor", 8.0)
    low, high = rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old_ctx = rope.get("original_max_position_embeddings", 8192)
    low_wl, high_wl = old_ctx / low, old_ctx / high
    out = []
    for freq in freqs:
        wl = 2 * math.pi / freq
        if wl < high_wl:
            out.append(1.0)
        elif wl > low_wl:
            out.append(factor)
        else:
            smooth = (old_ctx / wl - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def conversion_notes(config: dict[str, Any]) -> list[str]:
    """Differences between HF and llama.cpp that a reader of the results should know about."""
    notes = []
    sw = config.get("sliding_window")
    if sw and (config.get("use_sliding_window", True)) and sw < config.get("max_position_embeddings", 0):
        notes.append(f"sliding_window={sw} is not applied by llama.cpp's {architecture_of(config)[1]} graph; "
                      f"outputs can differ from HF only for contexts longer than {sw} tokens")
    return notes


# ----------------------------------------------------------------------------------------------
# tokenizer

def _is_byte_level(tok: dict[str, Any]) -> bool:
    def has(node: Any) -> bool:
        if not isinstance(node, dict):
            return False
        if node.get("type") == "ByteLevel":
            return True
        return any(has(x) for x in node.get("pretokenizers", []) + node.get("decoders", []))
    return has(tok.get("pre_tokenizer")) or has(tok.get("decoder"))


def _special_id(config: dict, tok_config: dict, vocab: dict[str, int], key: str) -> int | None:
    value = config.get(f"{key}_token_id")
    if isinstance(value, list):
        value = value[0] if value else None
    if value is None:
        name = tok_config.get(f"{key}_token")
        if isinstance(name, dict):
            name = name.get("content")
        value = vocab.get(name) if isinstance(name, str) else None
    return int(value) if value is not None else None


def write_tokenizer(writer: Any, model_dir: Path, config: dict, n_vocab: int) -> None:
    import gguf

    tok = json.loads((model_dir / "tokenizer.json").read_text())
    tok_config_path = model_dir / "tokenizer_config.json"
    tok_config = json.loads(tok_config_path.read_text()) if tok_config_path.is_file() else {}
    model = tok.get("model", {})
    if model.get("type") != "BPE":
        raise Unsupported(f"gguf conversion supports BPE tokenizers only; {model_dir}/tokenizer.json has "
                          f"model type {model.get('type')}")
    byte_fallback = bool(model.get("byte_fallback"))
    if not byte_fallback and not _is_byte_level(tok):
        raise Unsupported("gguf conversion supports byte-level BPE (gpt2 style) or BPE with byte fallback; "
                          f"the tokenizer in {model_dir} is neither")
    vocab: dict[str, int] = dict(model["vocab"])
    added = {a["id"]: a for a in tok.get("added_tokens", [])}
    for a in added.values():
        vocab[a["content"]] = a["id"]
    by_id = {i: t for t, i in vocab.items()}
    if max(by_id) >= n_vocab:
        raise Unsupported(f"tokenizer has id {max(by_id)} but the embedding has only {n_vocab} rows")

    tokens, types, scores = [], [], []
    for i in range(n_vocab):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.CONTROL if added[i].get("special", True) else gguf.TokenType.USER_DEFINED)
        elif byte_fallback and len(by_id[i]) == 6 and by_id[i].startswith("<0x") and by_id[i].endswith(">"):
            tokens.append(by_id[i])
            types.append(gguf.TokenType.BYTE)
        else:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL)
        scores.append(-float(i))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]

    if byte_fallback:
        writer.add_tokenizer_model("llama")
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(types)
        writer.add_add_space_prefix(False)
    else:
        writer.add_tokenizer_model("gpt2")
        # "default" pre-tokenizer: only used if llama.cpp tokenizes text, which the benchmark never asks
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges(merges)
    for key, add in (("bos", writer.add_bos_token_id), ("eos", writer.add_eos_token_id),
                     ("pad", writer.add_pad_token_id)):
        value = _special_id(config, tok_config, vocab, key)
        if value is not None and 0 <= value < n_vocab:
            add(value)
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    template = chat_template(model_dir)
    if template:
        writer.add_chat_template(template)


# ----------------------------------------------------------------------------------------------
# conversion

def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF rotate-half row order -> llama.cpp interleaved pairs (convert_hf_to_gguf.py LlamaModel.permute)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape))


_LAYER_MAP = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.o_proj.bias": "attn_output.bias",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _gguf_name(name: str) -> str | None:
    """HF tensor name -> GGUF name; None for tensors llama.cpp does not need; Unsupported if unknown."""
    if name.startswith("model.layers."):
        rest = name[len("model.layers."):]
        idx, _, tail = rest.partition(".")
        if tail == "self_attn.rotary_emb.inv_freq":
            return None
        if tail in _LAYER_MAP:
            return f"blk.{int(idx)}.{_LAYER_MAP[tail]}"
    elif name == "model.embed_tokens.weight":
        return "token_embd.weight"
    elif name == "model.norm.weight":
        return "output_norm.weight"
    elif name == "lm_head.weight":
        return "output.weight"
    raise Unsupported(f"gguf conversion does not know tensor {name}")


def _encode(arr: np.ndarray, out_type: str) -> tuple[np.ndarray, Any]:
    """(data, raw_dtype for GGUFWriter.add_tensor). 1-D tensors (norms, biases) stay F32 in every output,
    as llama.cpp's own converter keeps them."""
    import gguf

    if arr.ndim <= 1 or out_type == "f32":
        return np.ascontiguousarray(arr, dtype=np.float32), None
    if out_type == "f16":
        return np.ascontiguousarray(arr, dtype=np.float16), None
    data = gguf.quants.quantize(np.ascontiguousarray(arr, dtype=np.float32), gguf.GGMLQuantizationType.BF16)
    return data, gguf.GGMLQuantizationType.BF16


def _atomic_target(final: Path) -> Path:
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=final.name + ".", suffix=".part", dir=final.parent)
    os.close(fd)
    return Path(tmp)


def convert_hf_to_gguf(model_dir: str | os.PathLike, out_path: str | os.PathLike, out_type: str = "f32") -> Path:
    """Write a GGUF for an HF checkpoint directory (no caching; see `converted_gguf`)."""
    import gguf

    if out_type not in OUT_TYPES:
        raise ValueError(f"out_type must be one of {OUT_TYPES}, got {out_type!r}")
    model_dir, out_path = Path(model_dir), Path(out_path)
    config = read_config(model_dir)
    hf_arch, arch, permute = architecture_of(config)
    n_head = int(config["num_attention_heads"])
    n_kv = int(config.get("num_key_value_heads") or n_head)
    head_dim = _head_dim(config)
    rope = _rope(config)
    rope_type = str(rope.get("rope_type", "default")).lower()
    if rope_type not in ("default", "linear", "llama3"):
        raise Unsupported(f"gguf conversion does not support rope type {rope_type} (supported: default, linear, llama3)")

    tensors: dict[str, np.ndarray] = {}
    for path in _safetensors_files(model_dir):
        for name, arr in _read_safetensors(path):
            gname = _gguf_name(name)
            if gname is None:
                continue
            if permute and ".attn_q." in gname:
                arr = _permute(arr, n_head)
            elif permute and ".attn_k." in gname:
                arr = _permute(arr, n_kv)
            tensors[gname] = arr
    if "token_embd.weight" not in tensors:
        raise Unsupported(f"{model_dir}: no model.embed_tokens.weight in the checkpoint")
    tied = bool(config.get("tie_word_embeddings", False))
    if "output.weight" not in tensors and not tied:
        raise Unsupported(f"{model_dir}: no lm_head.weight and tie_word_embeddings is false")
    if tied and "output.weight" in tensors and np.array_equal(tensors["output.weight"], tensors["token_embd.weight"]):
        del tensors["output.weight"]  # tied: llama.cpp reuses token_embd, as its own converter writes it
    if rope_type == "llama3":
        tensors["rope_freqs.weight"] = _llama3_rope_factors(rope, head_dim)
    n_vocab = int(tensors["token_embd.weight"].shape[0])

    tmp = _atomic_target(out_path)
    try:
        w = gguf.GGUFWriter(str(tmp), arch)
        w.add_name(model_dir.name)
        w.add_type("model")
        w.add_context_length(int(config.get("max_position_embeddings", 2048)))
        w.add_embedding_length(int(config["hidden_size"]))
        w.add_block_count(int(config["num_hidden_layers"]))
        w.add_feed_forward_length(int(config["intermediate_size"]))
        w.add_head_count(n_head)
        w.add_head_count_kv(n_kv)
        if head_dim != int(config["hidden_size"]) // n_head:
            w.add_key_length(head_dim)
            w.add_value_length(head_dim)
        w.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
        w.add_rope_freq_base(float(rope["rope_theta"]))
        w.add_rope_dimension_count(head_dim)
        if rope_type == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(float(rope["factor"]))
        w.add_vocab_size(n_vocab)
        w.add_file_type(FTYPES[{"f32": "fp32", "f16": "fp16", "bf16": "bf16"}[out_type]])
        w.add_string("lossless_bench.source_architecture", hf_arch)
        w.add_string("lossless_bench.converter_version", CONVERTER_VERSION)
        write_tokenizer(w, model_dir, config, n_vocab)
        for gname, arr in tensors.items():
            data, raw = _encode(arr, out_type)
            if raw is None:
                w.add_tensor(gname, data)
            else:
                w.add_tensor(gname, data, raw_dtype=raw)  # byte-shaped uint8 data; the writer derives the shape
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, out_path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return out_path


def _cache_root(cache_dir: str | os.PathLike | None) -> Path:
    if cache_dir:
        return Path(cache_dir) / "gguf"
    env = os.environ.get("LOSSLESS_BENCH_CACHE")
    base = Path(env) if env else Path.home() / ".cache" / "lossless-bench"
    return base / "gguf"


def converted_gguf(model_dir: str | os.PathLike, out_type: str = "f32",
                   cache_dir: str | os.PathLike | None = None) -> tuple[Path, bool]:
    """(path, cache_hit): the cached GGUF for this checkpoint and output type, converting on a miss."""
    model_dir = Path(model_dir)
    architecture_of(read_config(model_dir))  # Unsupported before hashing gigabytes
    key = hashlib.sha256(f"{checkpoint_hash(model_dir)}|conv{CONVERTER_VERSION}|{out_type}".encode()).hexdigest()[:24]
    path = _cache_root(cache_dir) / f"{model_dir.name}-{key}-{out_type}.gguf"
    if path.is_file():
        return path, True
    return convert_hf_to_gguf(model_dir, path, out_type), False


@contextlib.contextmanager
def captured_llama_logs(lines: list[str]):
    """Route llama.cpp's log lines into `lines` (instead of stderr) for the duration of the block."""
    import llama_cpp
    import llama_cpp._logger as lcpp_logger

    @llama_cpp.llama_log_callback
    def _cb(level, text, user_data):  # noqa: ARG001
        try:
            lines.append(text.decode("utf-8", "replace"))
        except Exception:  # never raise through C
            pass

    llama_cpp.llama_log_set(_cb, ctypes.c_void_p(0))
    try:
        yield
    finally:
        llama_cpp.llama_log_set(lcpp_logger.llama_log_callback, ctypes.c_void_p(0))


def quantize_gguf(src: str | os.PathLike, dst: str | os.PathLike, level: str, nthread: int = 0) -> Path:
    """llama.cpp's own quantizer (llama_model_quantize) from an F32 GGUF, written atomically.

    Beside the GGUF goes `<name>.json` with what the quantizer reported, e.g. how many tensors fell
    back to another type (K-quants need rows that are multiples of 256)."""
    import llama_cpp

    if level not in QUANT_LEVELS:
        raise Unsupported(f"quantization level {level} is not one of {', '.join(QUANT_LEVELS)}")
    dst = Path(dst)
    tmp = _atomic_target(dst)
    logs: list[str] = []
    try:
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = FTYPES[level]
        params.nthread = nthread
        with captured_llama_logs(logs):
            rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
        if rc != 0:
            tail = "".join(logs).strip().splitlines()[-3:]
            raise RuntimeError(f"llama_model_quantize({src} -> {level}) returned {rc}: {' | '.join(tail)}")
        fallback = [ln.split("WARNING:", 1)[1].strip() for ln in logs if "fallback quantization" in ln]
        side = {"level": level, "source": Path(src).name, "llama_cpp_python": llama_cpp.__version__,
                "fallback": fallback[0] if fallback else None}
        side_tmp = _atomic_target(dst.with_suffix(".json"))
        side_tmp.write_text(json.dumps(side, indent=1))
        os.replace(side_tmp, dst.with_suffix(".json"))
        os.replace(tmp, dst)
    finally:
        if tmp.exists():
            tmp.unlink()
    return dst


def quantized_gguf(model_dir: str | os.PathLike, level: str,
                   cache_dir: str | os.PathLike | None = None) -> tuple[Path, bool]:
    """(path, cache_hit): the cached quantized GGUF, made from the cached F32 conversion on a miss."""
    import llama_cpp

    src, _ = converted_gguf(model_dir, "f32", cache_dir)
    key = hashlib.sha256(f"{src.name}|{level}|llama_cpp {llama_cpp.__version__}".encode()).hexdigest()[:12]
    dst = src.with_name(src.name.replace("-f32.gguf", f"-{level}-{key}.gguf"))
    if dst.is_file():
        return dst, True
    return quantize_gguf(src, dst, level), False


def gguf_file_type(path: str | os.PathLike) -> int | None:
    """general.file_type of a GGUF file (LLAMA_FTYPE_*), or None if absent."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    field = reader.fields.get("general.file_type")
    if field is None:
        return None
    return int(field.parts[field.data[0]][0])


def level_of_file_type(ftype: int | None) -> str | None:
    for level, value in FTYPES.items():
        if value == ftype:
            return level
    return None


def gguf_for(source: str | os.PathLike, quantization: str,
             cache_dir: str | os.PathLike | None = None) -> tuple[Path, dict[str, Any]]:
    """The GGUF to load for a model source and logical quantization level, plus facts for AdapterInfo."""
    source = Path(source)
    if source.suffix == ".gguf":
        if not source.is_file():
            raise FileNotFoundError(f"GGUF file {source} does not exist")
        ftype = gguf_file_type(source)
        file_level = level_of_file_type(ftype)
        if quantization not in ("gguf", file_level):
            raise Unsupported(f"{source.name} is a GGUF file of type {file_level or ftype}; a .gguf model runs as it is: "
                              f"use quantization 'gguf'" + (f" or '{file_level}'" if file_level else ""))
        return source, {"gguf_origin": "given", "gguf_file_type": ftype, "gguf_level": file_level or "unknown"}
    if not source.is_dir():
        raise FileNotFoundError(f"model source {source} is neither an HF checkpoint directory nor a .gguf file")
    if quantization == "gguf":
        raise Unsupported("quantization 'gguf' means a given .gguf file used as it is; "
                          f"{source} is an HF checkpoint (use fp32/fp16/bf16 or a quantized level)")
    config = read_config(source)
    facts: dict[str, Any] = {"gguf_origin": "converted", "converter_version": CONVERTER_VERSION,
                             "source_architecture": architecture_of(config)[0], "gguf_level": quantization}
    if quantization in LEVEL_OUT_TYPE:
        path, hit = converted_gguf(source, LEVEL_OUT_TYPE[quantization], cache_dir)
    elif quantization in QUANT_LEVELS:
        path, hit = quantized_gguf(source, quantization, cache_dir)
        facts["quantized_from"] = "f32"
        side = path.with_suffix(".json")
        if side.is_file() and json.loads(side.read_text()).get("fallback"):
            facts["quantize_fallback"] = json.loads(side.read_text())["fallback"]
    else:
        raise Unsupported(f"llamacpp cannot run quantization {quantization}")
    facts["gguf_cache_hit"] = hit
    facts["gguf_file_type"] = FTYPES[quantization]
    notes = conversion_notes(config)
    if notes:
        facts["conversion_notes"] = notes
    return path, facts
