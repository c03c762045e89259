"""How many bytes of weights an engine group loads: what the duration estimate scales with.

A model is sized, in this order, from
  - a local `.gguf` file: its size (it runs as it is);
  - a local checkpoint dir or a hub id whose `config.json` is here (the dir, or the Hugging Face
    cache: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub): its parameter count,
    computed from the architecture, times the bytes per parameter of the cell's quantization;
  - a local dir without a config: the size of its weight files;
  - a hub id not cached here: the hub's safetensors metadata (parameter counts per dtype), where
    the hub answers (not with HF_HUB_OFFLINE=1; once it cannot be reached, it is not asked again);
  - otherwise unknown: 1 GB, as before.
The cache is read without downloading anything: sizing a matrix must not fetch models.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path

GB = 1e9
UNKNOWN_BYTES = 1 << 30
# Builtin test models (orchestrator/inputs/tiny_model.py) are a few MB: sized without building them.
BUILTIN_BYTES = 2_000_000
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")

# Bytes per parameter as the engine holds the weights. GGUF levels: bits per weight of llama.cpp's
# formats / 8 (q8_0 8.5, q6_k 6.56, q5_k_m ~5.7, q4_k_m ~4.85, q4_0 4.5); 4-bit formats with group
# scales (awq, gptq, bnb_4bit) ~4.5 bits.
BYTES_PER_PARAM = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "bnb_8bit": 1.0, "q8_0": 1.06,
                   "q6_k": 0.82, "q5_k_m": 0.71, "q4_k_m": 0.6, "q4_0": 0.56, "awq": 0.56, "gptq": 0.56,
                   "bnb_4bit": 0.56}
DTYPE_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "F32": 4.0, "F16": 2.0, "BF16": 2.0,
               "F8_E4M3": 1.0, "F8_E5M2": 1.0, "I8": 1.0, "U8": 1.0, "I32": 4.0}


def hf_hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface"
    return Path(home) / "hub"


def cached_config(repo_id: str, revision: str | None = None) -> Path | None:
    """config.json of a hub model in the local Hugging Face cache (the revision's snapshot, else main's, else any)."""
    repo = hf_hub_cache() / ("models--" + repo_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    wanted = []
    for ref in ([revision] if revision else []) + ["main"]:
        ref_file = repo / "refs" / ref
        wanted.append(ref_file.read_text().strip() if ref_file.is_file() else ref)
    candidates = [snapshots / w / "config.json" for w in wanted] + sorted(snapshots.glob("*/config.json"))
    return next((c for c in candidates if c.is_file()), None)


def _get(cfg: dict, *names, default=None):
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    return default


def params_from_config(cfg: dict) -> int | None:
    """Parameter count of a decoder-only transformer from its config.json (within a few percent for
    Llama-, Qwen-, Mistral-, Gemma- and GPT-style configs, and mixture-of-experts ones); None when the
    config does not say enough."""
    cfg = cfg.get("text_config") or cfg.get("llm_config") or cfg
    hidden = _get(cfg, "hidden_size", "n_embd", "d_model")
    layers = _get(cfg, "num_hidden_layers", "n_layer", "num_layers")
    vocab = _get(cfg, "vocab_size", "padded_vocab_size")
    if not (hidden and layers and vocab):
        return None
    heads = _get(cfg, "num_attention_heads", "n_head", default=max(1, hidden // 128))
    kv_heads = _get(cfg, "num_key_value_heads", "num_kv_heads", default=heads)
    head_dim = _get(cfg, "head_dim", default=hidden // heads)
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)          # q, o and k, v projections
    gated = "llama" in str(cfg.get("model_type", "")) or _get(cfg, "hidden_act", "activation_function",
                                                              default="silu") in ("silu", "swiglu", "gelu_pytorch_tanh")
    inner = _get(cfg, "intermediate_size", "n_inner", "ffn_dim", default=4 * hidden)
    mlp = (3 if gated else 2) * hidden * inner
    experts = _get(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0)
    if experts:
        expert_inner = _get(cfg, "moe_intermediate_size", default=inner)
        shared = _get(cfg, "n_shared_experts", "num_shared_experts", default=0)
        mlp = 3 * hidden * expert_inner * (experts + shared) + hidden * experts   # experts + router
    embeddings = vocab * hidden * (1 if cfg.get("tie_word_embeddings", True) is not False else 2)
    if cfg.get("tie_word_embeddings") is None and "llama" in str(cfg.get("model_type", "")):
        embeddings = 2 * vocab * hidden          # Llama's default is untied
    return int(layers * (attention + mlp + 2 * hidden) + embeddings + hidden)


def _bytes_per_param(quantization: str | None, cfg: dict) -> float:
    if quantization in BYTES_PER_PARAM:
        return BYTES_PER_PARAM[quantization]
    q = cfg.get("quantization_config") or {}
    if q.get("bits"):
        return q["bits"] / 8 + 0.06
    return DTYPE_BYTES.get(str(cfg.get("torch_dtype") or cfg.get("dtype")), 2.0)


def _local_weight_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.suffix in WEIGHT_SUFFIXES and f.is_file())


_hub_failed = False


def _hub_params(repo_id: str, revision: str | None) -> int | None:
    """Parameter count from the hub's safetensors metadata (no weights downloaded); None offline."""
    global _hub_failed
    if _hub_failed or os.environ.get("HF_HUB_OFFLINE") in ("1", "true", "True"):
        return None
    try:
        from huggingface_hub import errors, get_safetensors_metadata
    except ImportError:
        _hub_failed = True
        return None
    answered = (errors.HfHubHTTPError, errors.HFValidationError, errors.NotASafetensorsRepoError,
                errors.SafetensorsParsingError)
    try:
        meta = get_safetensors_metadata(repo_id, revision=revision)
        return int(sum(meta.parameter_count.values())) or None
    except answered:    # gated, missing, not safetensors: this model only
        return None
    except Exception:   # unreachable: one failure is enough to stop asking for the others
        _hub_failed = True
        return None


@lru_cache(maxsize=None)
def weight_bytes(source: str, quantization: str | None = None, revision: str | None = None) -> tuple[int, str]:
    """(bytes, how it was sized: gguf file | config | weight files | hub metadata | builtin | unknown)."""
    if source.startswith("builtin:"):
        return BUILTIN_BYTES, "builtin"
    path = Path(source).expanduser()
    if path.is_file():
        return path.stat().st_size, "gguf file"
    config = path / "config.json" if path.is_dir() else None
    if config is None and "/" in source and not source.startswith((".", "/")):
        config = cached_config(source, revision)
    if config is not None and config.is_file():
        try:
            cfg = json.loads(config.read_text())
            params = params_from_config(cfg)
        except (OSError, ValueError):
            cfg, params = {}, None
        if params:
            return int(params * _bytes_per_param(quantization, cfg)), "config"
    if path.is_dir():
        size = _local_weight_bytes(path)
        if size:
            return size, "weight files"
    if not path.exists() and "/" in source:
        params = _hub_params(source, revision)
        if params:
            return int(params * BYTES_PER_PARAM.get(quantization or "", 2.0)), "hub metadata"
    return UNKNOWN_BYTES, "unknown"
