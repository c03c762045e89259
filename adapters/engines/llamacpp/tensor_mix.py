"""Per-tensor quantization types (`tensor_types`, a llama.cpp Options field): llama.cpp's own quantizer with its
tensor type overrides, the files cached by what they hold; and the tensor groups of a quantized GGUF (what
`bench explain --sensitivity` quantizes one at a time).

How llama.cpp applies the overrides (src/llama-quant.cpp of the pinned llama-cpp-python 0.3.36,
`llama_tensor_get_type`): `llama_model_quantize_params.tt_overrides` is an array of {pattern, type} ended by a
NULL pattern; each pattern is a std::regex searched (`std::regex_search`, not a full match) in the tensor's name,
the first that matches wins. They are read only when the file type (`ftype`) is a quantized one, and only for
tensors the quantizer may quantize at all (2-D `*.weight`, not norms): with ftype F32 they are ignored. So a
file that is F32 but for one group is the cell's ftype (q4_0, ...) with the overrides {group: its type, ".": f32}:
the catch-all keeps every other weight at F32 (an F32 source tensor asked to stay F32 is copied). Tensors no
pattern matches get llama.cpp's own mixture for that ftype, as `llama-quantize --tensor-type` does.

The cache key adds the overrides, in order, to the quantized file's key (gguf_convert.quantized_gguf's parts),
so a matrix naming the same `tensor_types` runs the same bytes, and `<name>.json` beside the file says what
each tensor became (read back with gguf-py).

An importance matrix (the llama.cpp option `imatrix`: a file imatrix.py writes) goes to the same call as
`llama_model_quantize_params.imatrix`; the key then adds the imatrix's digest (imatrix.imatrix_digest), and the
side file names it and the weights the quantizer found no entry for (its "did not find weights for" lines).
A preset level with an imatrix and no overrides is made here too (no overrides: llama.cpp's own mixture).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from adapters.base import Unsupported

# the ggml types an override may name (gguf-py's GGMLQuantizationType names, lower case); others are refused
OVERRIDE_TYPES = ("f32", "f16", "bf16", "q8_0", "q6_k", "q5_k", "q5_1", "q5_0", "q4_k", "q4_1", "q4_0", "q3_k",
                  "q2_k", "iq4_nl")
# a weight's group: one layer's one kind (blk.3.attn_q) or a whole-model tensor (token_embd, output)
_GROUP = re.compile(r"^(blk\.\d+\.[a-z_]+|[a-z_]+)\.weight$")


def ggml_type(name: str) -> int:
    import gguf

    return int(gguf.GGMLQuantizationType[name.upper()])


def check_tensor_types(tensor_types: dict[str, str]) -> None:
    """ValueError unless every key compiles as a regex and every value is a type an override may name."""
    for pattern, kind in tensor_types.items():
        try:
            re.compile(pattern)
        except re.error as e:
            raise ValueError(f"tensor_types: {pattern!r} is not a regular expression ({e})") from None
        if kind not in OVERRIDE_TYPES:
            raise ValueError(f"tensor_types: {pattern!r} -> {kind!r}: the type must be one of {', '.join(OVERRIDE_TYPES)}")


def tensor_types_key(tensor_types: dict[str, str]) -> str:
    """The overrides as the cache key and the row name them: in order (the first match wins)."""
    return json.dumps(list(tensor_types.items()), separators=(",", ":"))


def quantize_mixed(src: str | os.PathLike, dst: str | os.PathLike, level: str, tensor_types: dict[str, str],
                   nthread: int = 0, imatrix: dict[str, Any] | None = None) -> Path:
    """llama_model_quantize from an F32 GGUF at `level`'s ftype with `tensor_types` as tt_overrides (and `imatrix`,
    weight name -> float32 values, as its importance matrix), written atomically, with `<name>.json` beside it (the
    overrides, the imatrix's digest and each tensor's type in the written file)."""
    import llama_cpp

    from adapters.engines.llamacpp.imatrix import MISSING, c_imatrix, imatrix_digest

    from adapters.engines.llamacpp.gguf_convert import FTYPES, QUANT_LEVELS, captured_llama_logs

    if level not in QUANT_LEVELS:
        raise Unsupported(f"tensor_types needs a quantized level ({', '.join(QUANT_LEVELS)}): llama.cpp reads its "
                          f"tensor type overrides only when the file type is quantized; this cell is {level}")
    check_tensor_types(tensor_types)
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f"{dst.name}.{os.getpid()}.part")        # this process's own name: writers race harmlessly
    side_tmp = tmp.with_suffix(".json.part")
    overrides = (llama_cpp.llama_model_tensor_override * (len(tensor_types) + 1))()
    keep = [p.encode() for p in tensor_types]       # the C strings live as long as the call
    for i, (pattern, kind) in enumerate(zip(keep, tensor_types.values())):
        overrides[i].pattern, overrides[i].type = pattern, ggml_type(kind)
    overrides[len(tensor_types)].pattern = None      # the terminator llama.cpp's loop stops at
    logs: list[str] = []
    try:
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.nthread = FTYPES[level], nthread
        params.tt_overrides = ctypes.cast(overrides, ctypes.POINTER(llama_cpp.llama_model_tensor_override))
        if imatrix:
            entries, _alive = c_imatrix(imatrix)       # the buffers live as long as the call
            params.imatrix = ctypes.cast(entries, ctypes.POINTER(llama_cpp.llama_model_imatrix_data))
        with captured_llama_logs(logs):
            rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
        if rc != 0:
            raise RuntimeError(f"llama_model_quantize({src} -> {level} with tensor_types) returned {rc}: "
                               + " | ".join("".join(logs).strip().splitlines()[-3:]))
        side = {"level": level, "tensor_types": list(tensor_types.items()), "source": Path(src).name,
                "llama_cpp_python": llama_cpp.__version__, "tensors": gguf_tensor_types(tmp)}
        if imatrix:
            side |= {"imatrix_digest": imatrix_digest(imatrix), "imatrix_entries": sorted(imatrix),
                     "imatrix_not_found": sorted(set(MISSING.findall("".join(logs))))}
        side_tmp.write_text(json.dumps(side, indent=1))
        os.replace(side_tmp, dst.with_suffix(".json"))
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
        side_tmp.unlink(missing_ok=True)
    return dst


def mixed_gguf(source: str | os.PathLike, level: str, tensor_types: dict[str, str],
               cache_dir: str | os.PathLike | None = None, imatrix: str | None = None) -> tuple[Path, dict[str, Any]]:
    """The GGUF of an HF checkpoint at `level` with `tensor_types` applied and the imatrix file `imatrix` given to
    the quantizer (cached), and the facts for the row."""
    import llama_cpp

    from adapters.engines.llamacpp.gguf_convert import converted_gguf, gguf_for
    from adapters.engines.llamacpp.imatrix import imatrix_digest, read_imatrix

    if str(source).endswith(".gguf"):
        raise Unsupported("tensor_types and imatrix re-quantize from the F32 conversion of an HF checkpoint; a .gguf "
                          "model runs as it is")
    _, facts = gguf_for(source, level, cache_dir)     # the cell's own file: the checks and conversion facts
    src, _ = converted_gguf(source, "f32", cache_dir)
    data = read_imatrix(imatrix) if imatrix else None
    digest = imatrix_digest(data) if data else None
    key = hashlib.sha256(f"{src.name}|{level}|{tensor_types_key(tensor_types)}|llama_cpp {llama_cpp.__version__}"
                         .encode() + (f"|imatrix {digest}".encode() if digest else b"")).hexdigest()[:12]
    dst = src.with_name(src.name.replace("-f32.gguf", f"-{level}-{'im' if digest else 'tt'}-{key}.gguf"))
    hit = dst.is_file() and dst.with_suffix(".json").is_file()
    if not hit:
        quantize_mixed(src, dst, level, tensor_types, imatrix=data)
    facts.pop("quantize_fallback", None)              # said of the preset's file, not this one
    extra = {"imatrix_digest": digest,
             "imatrix_not_found": json.loads(dst.with_suffix(".json").read_text()).get("imatrix_not_found")} if digest else {}
    return dst, {**facts, "gguf_cache_hit": hit, "tensor_types": list(tensor_types.items()), **extra}


def gguf_tensor_types(path: str | os.PathLike) -> dict[str, str]:
    """Tensor name -> its ggml type name (lower case), read with gguf-py."""
    import gguf

    return {t.name: t.tensor_type.name.lower() for t in gguf.GGUFReader(str(path)).tensors}


def tensor_groups(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The quantized weights of a GGUF by group (per layer and kind: blk.N.attn_q, ...; token_embd; output), in
    file order: name, the regex naming its tensors, their type in this file, how many, their bytes here and at F32.
    Tensors this file keeps at F32/F16/BF16 (norms, anything the quantizer leaves) form no group."""
    import gguf

    groups: dict[str, dict[str, Any]] = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        kind = t.tensor_type.name.lower()
        found = _GROUP.match(t.name)
        if kind in ("f32", "f16", "bf16") or not found:
            continue
        g = groups.setdefault(found.group(1), {"group": found.group(1), "pattern": f"^{re.escape(found.group(1))}\\.weight$",
                                               "type": kind, "tensors": 0, "bytes": 0, "f32_bytes": 0})
        if g["type"] != kind:
            g["type"] = "mixed"
        g["tensors"] += 1
        g["bytes"] += int(t.n_bytes)
        g["f32_bytes"] += int(t.n_elements) * 4
    return list(groups.values())


def group_tensor_types(groups: list[dict[str, Any]]) -> dict[str, str]:
    """The overrides that quantize `groups` (each at its type in the cell's file) and keep every other weight F32."""
    return {**{g["pattern"]: g["type"] for g in groups}, ".": "f32"}
