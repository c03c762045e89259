"""llama.cpp's residual stream per block, through the eval callback (`cb_eval` of llama_context_params, called by
ggml's scheduler for each graph node: once with ask=True, "do you want this one?", then with ask=False once it is
computed). llama.cpp 0.3.36's graph names the nodes it builds: `embd` (the token embeddings' rows; `inp_embd` is
taken too), `l_out-N` (the output of block N, after its residual add), `result_norm` (the last block's output after
the final norm), so the capture follows transformers' `output_hidden_states` convention
(adapters.base.Adapter.hidden_states); `ffn_inp-N` (the residual after block N's attention) splits each block for
Adapter.residual_states. (Seen on the llama architecture; a model that scales its embeddings after the lookup, as
Gemma does, would have `embd` before that scale: not checked.)

The tensors are read with ggml's own accessors (ggml_get_name, ggml_nelements, ggml_nrows, ggml_nbytes,
ggml_backend_tensor_get from libggml-base, which llama-cpp-python ships), not by mirroring `struct ggml_tensor`,
so a field added to the struct cannot shift what is read; ggml_backend_tensor_get copies from whichever backend
holds the tensor (host or GPU). Every position asks for logits, so the last block runs on every position (llama.cpp
drops the positions without an output before the last block's FFN otherwise). The capture uses a context of its
own, built as the adapter's (KV types, flash attention, batch split, threads) plus the callback, one prompt at a
time, and freed after."""

from __future__ import annotations

import ctypes
import re

import numpy as np

from adapters.base import Unsupported
from adapters.engines.llamacpp.gguf_convert import captured_llama_logs
from adapters.engines.llamacpp.native import FLASH_ATTN_TYPES, KV_TYPES, Batch, last_error

_BLOCK = re.compile(r"(l_out|ffn_inp)-(\d+)")


def ggml_accessors():
    """libggml-base's tensor accessors, typed."""
    from llama_cpp import _ggml

    lib = _ggml.libggml
    vp, i64, sz = ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t
    for name, res, args in (("ggml_get_name", ctypes.c_char_p, [vp]), ("ggml_nelements", i64, [vp]),
                            ("ggml_nrows", i64, [vp]), ("ggml_nbytes", sz, [vp]),
                            ("ggml_backend_tensor_get", None, [vp, vp, sz, sz])):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


class _Capture:
    """The callback's state: the wanted tensors of the current prompt, by name, one array per ubatch."""

    def __init__(self, n_layer: int, split: bool):
        self.g = ggml_accessors()
        self.n_layer, self.split = n_layer, split
        self.parts: dict[int, list[np.ndarray]] = {}
        self.error: str | None = None
        self.fn = __import__("llama_cpp").ggml_backend_sched_eval_callback(self._cb)   # kept alive with self

    def index(self, name: str) -> int | None:
        """The capture index of a node name (0 embeddings, i the output of block i - 1), None if not wanted."""
        k = 2 if self.split else 1    # split: block i's attention residual at 2i + 1, its output at 2i + 2
        if name in ("embd", "inp_embd"):
            return 0
        if name == "result_norm":
            return k * self.n_layer
        m = _BLOCK.fullmatch(name)
        if m and (m.group(1) == "l_out" or self.split) and int(m.group(2)) < self.n_layer - (m.group(1) == "l_out"):
            return k * int(m.group(2)) + (1 if m.group(1) == "ffn_inp" else k)
        return None

    def _cb(self, t, ask, _user):
        try:
            i = self.index(self.g.ggml_get_name(t).decode())
            if ask or i is None:
                return i is not None
            n, rows, nbytes = self.g.ggml_nelements(t), self.g.ggml_nrows(t), self.g.ggml_nbytes(t)
            if nbytes != 4 * n:
                raise Unsupported(f"llama.cpp's {self.g.ggml_get_name(t).decode()} is not f32 ({nbytes} bytes for {n} values)")
            buf = np.empty((rows, n // rows), np.float32)
            self.g.ggml_backend_tensor_get(t, buf.ctypes.data, 0, nbytes)
            self.parts.setdefault(i, []).append(buf)
        except Exception as err:  # noqa: BLE001   # never raise through C: say so after the decode
            self.error = self.error or f"{type(err).__name__}: {err}"
        return True


def hidden_states(adapter, prompts: list[list[int]], split: bool = False) -> list[np.ndarray]:
    """[n_layer + 1, positions, hidden] float32 per prompt, from a context of its own with the callback set; with
    `split`, [2 n_layer + 1, ...]: each block's `ffn_inp-N` (the residual after its attention) before its output."""
    L = adapter._L
    if adapter._model is None:
        raise Unsupported("llamacpp: per-layer hidden states need the batched (C API) path, not prompt_lookup")
    n_layer = L.llama_model_n_layer(adapter._model)
    cap = _Capture(n_layer, split)
    n_idx = (2 if split else 1) * n_layer + 1
    opts = adapter.opts
    longest = max(len(p) for p in prompts)
    cp = L.llama_context_default_params()
    cp.n_ctx = -(-longest // 256) * 256
    cp.n_batch = min(opts.n_batch, cp.n_ctx)
    cp.n_ubatch = min(opts.n_ubatch, cp.n_batch)
    cp.n_seq_max = 1
    cp.n_threads = cp.n_threads_batch = adapter.n_threads
    cp.flash_attn_type = FLASH_ATTN_TYPES[adapter.flash_attn]
    if opts.type_k:
        cp.type_k = KV_TYPES[opts.type_k][0]
    if opts.type_v:
        cp.type_v = KV_TYPES[opts.type_v][0]
    cp.cb_eval = cap.fn
    cp.cb_eval_user_data = None
    logs: list[str] = []
    with captured_llama_logs(logs):
        ctx = L.llama_init_from_model(adapter._model, cp)
    if not ctx:
        raise RuntimeError(f"llama.cpp could not create the capture context: {last_error(logs)}")
    out = []
    try:
        batch = Batch(L, L.llama_n_batch(ctx))
        for p in prompts:
            cap.parts = {}
            L.llama_memory_clear(L.llama_get_memory(ctx), True)
            for lo in range(0, len(p), batch.capacity):
                hi = min(lo + batch.capacity, len(p))
                n = hi - lo
                batch.fill(np.asarray(p[lo:hi], np.int32), np.arange(lo, hi, dtype=np.int32), np.zeros(n, np.int32),
                           np.ones(n, np.int8))
                rc = L.llama_decode(ctx, batch.struct)
                if rc != 0:
                    raise RuntimeError(f"llama_decode returned {rc} in the hidden-state capture")
            if cap.error:
                raise RuntimeError(f"llama.cpp's eval callback failed: {cap.error}")
            missing = [i for i in range(n_idx) if i not in cap.parts]
            if missing:
                raise Unsupported(f"llama.cpp named no node for capture indices {missing} (this architecture's graph "
                                  "does not name embd / ffn_inp-N / l_out-N / result_norm)")
            layers = [np.concatenate(cap.parts[i]) for i in range(n_idx)]
            if any(a.shape[0] != len(p) for a in layers):
                raise RuntimeError(f"captured {[a.shape[0] for a in layers]} positions for a {len(p)}-token prompt")
            out.append(np.stack(layers))
    finally:
        L.llama_free(ctx)
    return out
