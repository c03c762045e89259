"""A Llama-architecture decoder in numpy (float64 by default): RMSNorm, rotary embeddings (rotate-half, as
transformers' Llama), grouped-query causal attention, a SwiGLU MLP; weights read from the checkpoint's
safetensors as transformers names them. A KV cache per request keeps greedy decoding linear."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ARCHITECTURES = ("LlamaForCausalLM",)


@dataclass(frozen=True)
class Config:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    rope_theta: float
    tied: bool

    @classmethod
    def read(cls, folder: Path) -> "Config":
        c = json.loads((folder / "config.json").read_text())
        rope = (c.get("rope_parameters") or {}).get("rope_theta", c.get("rope_theta", 10000.0))
        scaling = c.get("rope_scaling") or (c.get("rope_parameters") or {})
        if scaling.get("rope_type", scaling.get("type", "default")) not in ("default", None):
            raise ValueError(f"rope scaling {scaling.get('rope_type')!r} is not implemented here")
        heads = c["num_attention_heads"]
        return cls(hidden=c["hidden_size"], layers=c["num_hidden_layers"], heads=heads,
                   kv_heads=c.get("num_key_value_heads") or heads,
                   head_dim=c.get("head_dim") or c["hidden_size"] // heads, eps=c["rms_norm_eps"],
                   rope_theta=float(rope), tied=bool(c.get("tie_word_embeddings", False)))


def problem(config: dict) -> str | None:
    """Why this checkpoint is not one this engine evaluates, from its config alone."""
    arch = (config.get("architectures") or ["?"])[0]
    if arch not in ARCHITECTURES:
        return f"the numpy reference engine evaluates {', '.join(ARCHITECTURES)} only, not {arch}"
    for key in ("attention_bias", "mlp_bias"):
        if config.get(key):
            return f"the numpy reference engine has no {key}"
    if config.get("hidden_act", "silu") != "silu":
        return f"the numpy reference engine has no {config.get('hidden_act')} activation"
    return None


class Llama:
    def __init__(self, folder: str | Path, dtype: str = "float64") -> None:
        from safetensors.numpy import load_file

        folder = Path(folder)
        self.cfg = Config.read(folder)
        w: dict[str, np.ndarray] = {}
        for f in sorted(folder.glob("*.safetensors")):
            w.update(load_file(str(f)))
        self.w = {k: v.astype(dtype) for k, v in w.items()}
        self.dtype = dtype
        self.head = self.w["model.embed_tokens.weight"] if self.cfg.tied or "lm_head.weight" not in self.w \
            else self.w["lm_head.weight"]
        inv = 1.0 / (self.cfg.rope_theta ** (np.arange(0, self.cfg.head_dim, 2, dtype=np.float64) / self.cfg.head_dim))
        self.inv_freq = inv

    def _norm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.cfg.eps) * weight

    def _rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        angles = np.outer(positions, self.inv_freq)                     # [t, d/2]
        cos, sin = (np.concatenate([f(angles)] * 2, axis=-1).astype(self.dtype) for f in (np.cos, np.sin))
        half = x.shape[-1] // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rotated * sin                                  # x: [heads, t, d]

    def forward(self, ids: list[int], cache: list | None = None,
                states: list | None = None) -> tuple[np.ndarray, list]:
        """Logits [len(ids), vocab] of `ids` following what `cache` holds (None: nothing); the cache after them.
        `states`, where given, receives the residual stream: the embeddings, every block's output, the last
        one after the final norm (transformers' hidden_states convention)."""
        c, w = self.cfg, self.w
        start = 0 if not cache else cache[0][0].shape[1]
        positions = np.arange(start, start + len(ids))
        x = w["model.embed_tokens.weight"][np.asarray(ids)]
        cache = cache or [None] * c.layers
        new_cache = []
        keep = states.append if states is not None else (lambda _: None)
        keep(x)
        for i in range(c.layers):
            p = f"model.layers.{i}."
            h = self._norm(x, w[p + "input_layernorm.weight"])
            q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(len(ids), c.heads, c.head_dim).transpose(1, 0, 2)
            k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(len(ids), c.kv_heads, c.head_dim).transpose(1, 0, 2)
            v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(len(ids), c.kv_heads, c.head_dim).transpose(1, 0, 2)
            q, k = self._rope(q, positions), self._rope(k, positions)
            if cache[i] is not None:
                k, v = np.concatenate([cache[i][0], k], axis=1), np.concatenate([cache[i][1], v], axis=1)
            new_cache.append((k, v))
            rep = c.heads // c.kv_heads
            k, v = np.repeat(k, rep, axis=0), np.repeat(v, rep, axis=0)
            scores = q @ k.transpose(0, 2, 1) / np.sqrt(c.head_dim)     # [heads, t, start + t]
            causal = positions[:, None] < np.arange(k.shape[1])[None, :]
            scores = np.where(causal, -np.inf, scores)
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            attn = (scores / scores.sum(axis=-1, keepdims=True)) @ v    # [heads, t, d]
            x = x + attn.transpose(1, 0, 2).reshape(len(ids), -1) @ w[p + "self_attn.o_proj.weight"].T
            h = self._norm(x, w[p + "post_attention_layernorm.weight"])
            gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
            x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
            keep(x)
        x = self._norm(x, w["model.norm.weight"])
        if states is not None:
            states[-1] = x
        return x @ self.head.T, new_cache
