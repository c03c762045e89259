"""An importance matrix (imatrix) for llama.cpp's quantizer, from prompts run through the F32 GGUF: per weight, the
mean of the squared input activation of each input column (what llama.cpp's own `llama-imatrix` collects, the tool
the pinned llama-cpp-python wheel lacks), handed to `llama_model_quantize` as `llama_model_quantize_params.imatrix`
(tensor_mix.quantize_mixed).

How the quantizer reads it (src/llama-quant.cpp of llama-cpp-python 0.3.36): an array of
`llama_model_imatrix_data {name, data, size}` ended by a NULL name, copied into a map by weight name; a weight it
quantizes looks its name up, and `size` must be ne[0] (the row length, times ne[2] experts for MoE, which is not
built here) or the quantization aborts; a weight without an entry is quantized without one and logged ("did not
find weights for ..."). Q4_0 and the K-quants weigh each column's rounding error by it; Q8_0 ignores it.

The input of each matmul is a named node of llama.cpp's graph, captured with the eval callback and ggml's own
accessors (hidden.ggml_accessors; not by mirroring `struct ggml_tensor`). Checked in the pinned source for the
llama, qwen2 and qwen3 graphs (src/models/llama.cpp, qwen2.cpp, qwen3.cpp, llama-graph.cpp's build_ffn and
build_attn): blk.N.attn_q/k/v.weight <- `attn_norm-N`; blk.N.attn_output.weight <- `kqv_out-N`; blk.N.ffn_gate/
ffn_up.weight <- `ffn_norm-N`; blk.N.ffn_down.weight <- `ffn_swiglu-N` (build_ffn's SILU with a parallel gate is
one swiglu_split node; `ffn_gate_par` is not built for it); output.weight <- `result_norm`. token_embd is a row
lookup, not a matmul: no entry (llama-imatrix has none either). Mistral checkpoints convert to `llama`. Other
architectures, and any block weight of another kind (experts, biases-as-weights): unsupported, said in one line.

The capture context keeps the KV cache in F32 with flash attention off (so `kqv_out` is a contiguous F32 node),
asks for every position's logits (so the last block runs on every position) and decodes one prompt at a time.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from adapters.base import Unsupported

ARCHITECTURES = ("llama", "qwen2", "qwen3")
# a block weight's kind -> the node (suffixed -N) that is its matmul's input
BLOCK_INPUTS = {"attn_q": "attn_norm", "attn_k": "attn_norm", "attn_v": "attn_norm", "attn_output": "kqv_out",
                "ffn_gate": "ffn_norm", "ffn_up": "ffn_norm", "ffn_down": "ffn_swiglu"}
OUTPUT_INPUT = "result_norm"          # output.weight's input (absent when the output is tied to token_embd)
NOT_MATMULS = ("token_embd.weight",)  # row lookups: no importance to collect
_BLOCK_WEIGHT = re.compile(r"^blk\.(\d+)\.([a-z_0-9]+)\.weight$")
MISSING = re.compile(r"did not find weights for (\S+)")    # the quantizer's log line for a weight without data


def weight_inputs(path: str | os.PathLike) -> tuple[str, dict[str, tuple[str, int]]]:
    """(architecture, {weight name: (its input node, row length ne[0])}) for the 2-D weights of a GGUF; Unsupported
    for an architecture or a block weight whose input node is not known."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    field = reader.fields.get("general.architecture")
    arch = bytes(field.parts[field.data[0]]).decode() if field is not None else "?"
    if arch not in ARCHITECTURES:
        raise Unsupported(f"imatrix: llama.cpp's graph node names are checked for {', '.join(ARCHITECTURES)} only; "
                          f"this GGUF is {arch}")
    out: dict[str, tuple[str, int]] = {}
    for t in reader.tensors:
        if len(t.shape) < 2 or not t.name.endswith(".weight") or t.name in NOT_MATMULS:
            continue
        found = _BLOCK_WEIGHT.match(t.name)
        if t.name == "output.weight":
            out[t.name] = (OUTPUT_INPUT, int(t.shape[0]))
        elif found and found.group(2) in BLOCK_INPUTS:
            out[t.name] = (f"{BLOCK_INPUTS[found.group(2)]}-{found.group(1)}", int(t.shape[0]))
        else:
            raise Unsupported(f"imatrix: {arch}'s weight {t.name} has no known input node in llama.cpp's graph")
    return arch, out


class _Accumulate:
    """The callback's state: per wanted node, the sum of x_j^2 over the positions seen, and how many."""

    def __init__(self, wanted: set[str]):
        import llama_cpp

        from adapters.engines.llamacpp.hidden import ggml_accessors

        self.g, self.wanted = ggml_accessors(), wanted
        self.sums: dict[str, np.ndarray] = {}
        self.rows: dict[str, int] = {}
        self.error: str | None = None
        self.fn = llama_cpp.ggml_backend_sched_eval_callback(self._cb)   # kept alive with self

    def _cb(self, t, ask, _user):
        try:
            name = self.g.ggml_get_name(t).decode()
            if ask or name not in self.wanted:
                return name in self.wanted or not ask
            n, rows, nbytes = self.g.ggml_nelements(t), self.g.ggml_nrows(t), self.g.ggml_nbytes(t)
            if nbytes != 4 * n:
                raise Unsupported(f"llama.cpp's {name} is not a contiguous f32 node ({nbytes} bytes for {n} values)")
            buf = np.empty((rows, n // rows), np.float32)
            self.g.ggml_backend_tensor_get(t, buf.ctypes.data, 0, nbytes)
            sq = np.square(buf, dtype=np.float64).sum(axis=0)
            self.sums[name] = self.sums[name] + sq if name in self.sums else sq
            self.rows[name] = self.rows.get(name, 0) + rows
        except Exception as err:  # noqa: BLE001   # never raise through C: said after the decode
            self.error = self.error or f"{type(err).__name__}: {err}"
        return True


def compute_imatrix(gguf_path: str | os.PathLike, prompts: list[list[int]], n_threads: int | None = None
                    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """({weight name: mean x_j^2 over every position of `prompts`, float32 of the row length}, facts) from the F32
    GGUF at `gguf_path`."""
    import llama_cpp

    from adapters.engines.llamacpp.gguf_convert import captured_llama_logs
    from adapters.engines.llamacpp.native import FLASH_ATTN_TYPES, KV_TYPES, Batch, last_error

    arch, inputs = weight_inputs(gguf_path)
    if not prompts or not any(prompts):
        raise Unsupported("imatrix: no prompts to run")
    acc = _Accumulate({node for node, _ in inputs.values()})
    llama_cpp.llama_backend_init()
    logs: list[str] = []
    mp = llama_cpp.llama_model_default_params()
    mp.n_gpu_layers = 0
    with captured_llama_logs(logs):
        model = llama_cpp.llama_model_load_from_file(str(gguf_path).encode(), mp)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {gguf_path}: {last_error(logs)}")
    ctx = None
    try:
        longest = max(len(p) for p in prompts)
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = -(-longest // 256) * 256
        cp.n_batch = cp.n_ubatch = min(512, cp.n_ctx)
        cp.n_seq_max = 1
        cp.n_threads = cp.n_threads_batch = n_threads or len(os.sched_getaffinity(0))
        cp.flash_attn_type = FLASH_ATTN_TYPES["off"]
        cp.type_k = cp.type_v = KV_TYPES["f32"][0]
        cp.cb_eval, cp.cb_eval_user_data = acc.fn, None
        with captured_llama_logs(logs):
            ctx = llama_cpp.llama_init_from_model(model, cp)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not create the imatrix context: {last_error(logs)}")
        batch = Batch(llama_cpp, llama_cpp.llama_n_batch(ctx))
        for p in prompts:
            llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
            for lo in range(0, len(p), batch.capacity):
                hi = min(lo + batch.capacity, len(p))
                batch.fill(np.asarray(p[lo:hi], np.int32), np.arange(lo, hi, dtype=np.int32),
                           np.zeros(hi - lo, np.int32), np.ones(hi - lo, np.int8))
                if llama_cpp.llama_decode(ctx, batch.struct) != 0:
                    raise RuntimeError("llama_decode failed in the imatrix capture")
            if acc.error:
                raise RuntimeError(f"llama.cpp's eval callback failed: {acc.error}")
    finally:
        with captured_llama_logs(logs):
            if ctx:
                llama_cpp.llama_free(ctx)
            llama_cpp.llama_model_free(model)
    positions = sum(len(p) for p in prompts)
    data: dict[str, np.ndarray] = {}
    for weight, (node, width) in inputs.items():
        if node not in acc.sums:
            raise Unsupported(f"imatrix: llama.cpp's {arch} graph named no node {node} (the input of {weight})")
        if acc.sums[node].shape != (width,) or acc.rows[node] != positions:
            raise RuntimeError(f"imatrix: {node} gave {acc.sums[node].shape[0]} columns over {acc.rows[node]} positions; "
                               f"{weight} has rows of {width}, the prompts {positions} positions")
        data[weight] = (acc.sums[node] / acc.rows[node]).astype(np.float32)
    facts = {"architecture": arch, "prompts": len(prompts), "positions": positions, "weights": len(data),
             "digest": imatrix_digest(data), "source": Path(gguf_path).name,
             "statistic": "mean of the squared input activation per input column, over every position"}
    return data, facts


def imatrix_digest(data: dict[str, np.ndarray]) -> str:
    """sha256 over the entries by name (names and float32 bytes): what the quantized file's cache key names."""
    h = hashlib.sha256()
    for name in sorted(data):
        h.update(name.encode() + b"\0" + np.ascontiguousarray(data[name], np.float32).tobytes())
    return h.hexdigest()


def write_imatrix(path: str | os.PathLike, data: dict[str, np.ndarray], facts: dict[str, Any]) -> Path:
    """The entries as .npz (one array per weight name) and the facts as <name>.json beside it, written atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.part.npz")
    np.savez(tmp, **data)
    os.replace(tmp, path)
    side = path.with_suffix(".json")
    side_tmp = side.with_name(f"{side.name}.{os.getpid()}.part")
    side_tmp.write_text(json.dumps(facts, indent=1))
    os.replace(side_tmp, side)
    return path


def read_imatrix(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The entries of an imatrix file (write_imatrix), checked finite (the quantizer refuses non-finite values)."""
    path = Path(path)
    if not path.is_file():
        raise Unsupported(f"imatrix file {path} does not exist (bench explain --recipe --imatrix writes it)")
    with np.load(path) as f:
        data = {k: np.asarray(f[k], np.float32) for k in f.files}
    bad = [k for k, v in data.items() if v.ndim != 1 or not np.isfinite(v).all()]
    if bad or not data:
        raise Unsupported(f"imatrix file {path}: {'no entries' if not data else 'not finite 1-D entries: ' + ', '.join(bad[:3])}")
    return data


def c_imatrix(data: dict[str, np.ndarray]) -> tuple[Any, list[Any]]:
    """(the llama_model_imatrix_data array ended by a NULL name, the buffers it points into: keep them alive)."""
    import llama_cpp

    arr = (llama_cpp.llama_model_imatrix_data * (len(data) + 1))()
    keep: list[Any] = []
    for i, (name, values) in enumerate(data.items()):
        v, b = np.ascontiguousarray(values, np.float32), name.encode()
        keep += [v, b]
        arr[i].name, arr[i].data, arr[i].size = b, v.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), v.size
    arr[len(data)].name = None
    return arr, keep
