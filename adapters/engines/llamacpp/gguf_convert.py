"""HF checkpoint -> GGUF with llama.cpp's own converter, and GGUF -> quantized GGUF, cached by content.

The converter is llama.cpp's `convert_hf_to_gguf.py` with its `conversion/` modules and its own `gguf-py`,
taken from the source distribution of the pinned llama-cpp-python (`make llama-cpp-src` unpacks those files
into `.cache/llama-cpp-src/<version>/`; LOSSLESS_BENCH_LLAMACPP_SRC names another root): the converter of
the very llama.cpp revision that runs the GGUF. It runs in a child process (converter_child.py) with the Python
of `make env-convert`'s .venvs/convert, which has the transformers that llama.cpp revision pins (4.57.6; transformers
5 drops config names the converter reads, e.g. GPT-NeoX's rotary_pct), or this environment's Python with a note
saying so (converter_python), and writes
an F32, F16 or BF16 GGUF. Every text architecture in its TEXT_MODEL_MAP converts; one it lacks is
`Unsupported` before anything is read. The quantization ladder is llama.cpp's `llama_model_quantize` from
the F32 file, as before.

Tokenizers: for a BPE vocabulary the converter names llama.cpp's pre-tokenizer by hashing how the
tokenizer splits a fixed text (`get_vocab_base_pre`) and refuses one it has never seen, as the built-in
tiny models' trained BPE is. Then, and only then, the pre-tokenizer is chosen here from tokenizer.json's
own `pre_tokenizer` where llama.cpp implements that one exactly (`pre_tokenizer_by_structure`: a ByteLevel
pre-tokenizer with GPT-2's split regex and no prefix space is llama.cpp's "gpt-2"); the row's engine_args
say which (`tokenizer_pre`, `tokenizer_pre_source`) and a note says why. Any other unrecognised tokenizer
stays `Unsupported` with the converter's reason. The pre-tokenizer matters only where llama.cpp tokenizes
text itself (served prompts, chat); offline cells hand it token ids.

What the checkpoint says goes into the GGUF as the converter writes it: add_bos_token/add_eos_token from
tokenizer_config.json (llama.cpp then adds BOS to text it tokenizes exactly where the HF tokenizer does),
the chat template (llama-cpp-python's server renders chat requests with `tokenizer.chat_template` when no
chat_format is given), tied embeddings, sliding windows where llama.cpp's graph for that architecture has
them (a window the GGUF lacks is a note on the row).

Measured against the hand-written converter this replaced (Llama/Mistral/Qwen2 only), on the built-in
`tiny` model at f32: the same 21 tensors byte for byte, the same tokens and merges; only metadata differs
(general.* names, head key/value lengths written explicitly, tokenizer.ggml.pre "gpt-2" where it wrote
"default"); llama.cpp's logprobs from old and new files were identical (max abs diff 0.0 at f32, f16, bf16,
q8_0 and q4_k_m; tiny-qwen2 too). Agreement with transformers on eight architectures:
tests/engines/test_gguf_converter.py.

Caching: the key is a SHA-256 over the content digests of the checkpoint's files (adapters.meters.provenance
`model_files`: weights, configs, tokenizer), the converter's identity (llama-cpp-python version plus a digest
of the converter's files) and the output type; quantized files add the quantization level and
llama-cpp-python's version (the quantizer belongs to the engine). Files are written under a temporary name in
the cache directory and moved into place with os.replace, so a crash never leaves a truncated GGUF under the
final name and concurrent writers race harmlessly. Beside each converted GGUF goes `<name>.json`: the
converter version, source architecture and tokenizer choice, so a cache hit reports what a miss did.

A model given as a `.gguf` file is used as it is, never converted or re-quantized (a second
quantization would change what is measured): the quantization axis must be `gguf`, or the logical level
that matches the file's `general.file_type` (e.g. `q4_k_m` for a Q4_K_M file); anything else is
`Unsupported`. Conversely `gguf` on an HF checkpoint is `Unsupported` (there is no file to take as is).
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import functools
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from adapters.base import Unsupported
from adapters.meters.provenance import file_digest, model_files

OUT_TYPES = ("f32", "f16", "bf16")
# logical quantization level -> llama.cpp LLAMA_FTYPE_* value (include/llama.h)
FTYPES: dict[str, int] = {
    "fp32": 0, "fp16": 1, "bf16": 32,
    "q8_0": 7, "q6_k": 18, "q5_k_m": 17, "q4_k_m": 15, "q4_0": 2,
}
QUANT_LEVELS = ("q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0")
LEVEL_OUT_TYPE = {"fp32": "f32", "fp16": "f16", "bf16": "bf16"}

CHILD = Path(__file__).with_name("converter_child.py")
SRC_ENV = "LOSSLESS_BENCH_LLAMACPP_SRC"
# GPT-2's split regex, as tokenizers' ByteLevel pre-tokenizer applies it (use_regex: true) and llama.cpp's
# "gpt-2" pre-tokenizer (LLAMA_VOCAB_PRE_TYPE_GPT2) does
GPT2_PRE = "gpt-2"


# ----------------------------------------------------------------------------------------------
# the converter: where it is, what it is, what it converts

def converter_root() -> Path:
    env = os.environ.get(SRC_ENV)
    return Path(env) if env else Path(__file__).resolve().parents[3] / ".cache" / "llama-cpp-src"


def converter_dir() -> Path:
    """The unpacked converter of the installed llama-cpp-python version, or a clear error."""
    import llama_cpp

    path = converter_root() / llama_cpp.__version__
    if not (path / "convert_hf_to_gguf.py").is_file():
        raise FileNotFoundError(
            f"llama.cpp's HF -> GGUF converter for llama-cpp-python {llama_cpp.__version__} is not unpacked at "
            f"{path}: run `make llama-cpp-src` in the repository (it takes the converter from that version's "
            f"source distribution), or set {SRC_ENV} to a folder holding {llama_cpp.__version__}/convert_hf_to_gguf.py")
    return path


@functools.lru_cache(maxsize=4)
def converter_identity(src: Path) -> dict[str, str]:
    """What converted: llama-cpp-python's version plus a digest of the converter's files and of the child that runs it."""
    h = hashlib.sha256()
    files = [src / "convert_hf_to_gguf.py", *sorted((src / "conversion").glob("*.py")),
             *sorted((src / "gguf-py" / "gguf").rglob("*.py"))]
    for f in [*files, CHILD]:   # the child's two tokenizer rules are part of what converts
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    gguf_py = re.search(r'^version\s*=\s*"([^"]+)"', (src / "gguf-py" / "pyproject.toml").read_text(), re.M)
    env = converter_environment()   # the transformers that reads the config is part of what converts
    return {"converter": f"llama.cpp convert_hf_to_gguf.py from the llama-cpp-python {src.name} source distribution",
            "converter_version": f"{src.name}+{h.hexdigest()[:12]}+transformers-{env['converter_transformers']}",
            "converter_gguf_py": gguf_py.group(1) if gguf_py else "unknown", **env}


PYTHON_ENV = "LOSSLESS_BENCH_CONVERT_PYTHON"


def converter_python() -> tuple[str, str | None]:
    """The Python that runs the converter and, when it is not the converter's own environment, why not.

    `make env-convert` builds .venvs/convert with the transformers llama.cpp pins (4.57.x; transformers 5 no
    longer writes or reads some config names the converter asks for, e.g. GPT-NeoX's rotary_pct);
    LOSSLESS_BENCH_CONVERT_PYTHON names another interpreter. Without either, this environment's Python runs
    it and the reason says so (provenance: converter_env_reason)."""
    env = os.environ.get(PYTHON_ENV)
    if env:
        return env, None
    own = Path(__file__).resolve().parents[3] / ".venvs" / "convert" / "bin" / "python"
    if own.is_file():
        return str(own), None
    return sys.executable, (f"no converter environment ({own} absent; `make env-convert` builds it, or set "
                            f"{PYTHON_ENV}): converting under this environment's transformers, which that "
                            "llama.cpp revision does not pin")


@functools.lru_cache(maxsize=4)
def _python_transformers(python: str) -> str:
    """The transformers version an interpreter imports, read from its environment's dist-info (no child process)."""
    import importlib.metadata

    if Path(python) == Path(sys.executable):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version("transformers")
        return "none"
    env = Path(python).parent.parent
    found = sorted(env.glob("lib/python*/site-packages/transformers-*.dist-info"))
    return found[0].name[len("transformers-"):-len(".dist-info")] if found else "unknown"


def converter_environment() -> dict[str, str]:
    """Provenance of the converter's environment (part of the cache key through converter_identity)."""
    python, reason = converter_python()
    out = {"converter_python": python, "converter_transformers": _python_transformers(python)}
    if reason:
        out["converter_env_reason"] = reason
    return out


@functools.lru_cache(maxsize=4)
def converter_architectures(src: Path) -> frozenset[str]:
    """The HF architectures the converter writes as text models (its conversion.TEXT_MODEL_MAP), read
    without importing it (that would import torch)."""
    tree = ast.parse((src / "conversion" / "__init__.py").read_text())
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == "TEXT_MODEL_MAP" and node.value is not None:
            return frozenset(ast.literal_eval(node.value))
    raise RuntimeError(f"{src}/conversion/__init__.py has no TEXT_MODEL_MAP: not the converter this module knows")


def read_config(model_dir: Path) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise Unsupported(f"gguf conversion needs an HF checkpoint directory with config.json; {model_dir} has none")
    return json.loads(path.read_text())


def hf_architecture(config: dict[str, Any]) -> str:
    """The architecture the converter picks (its get_model_architecture: text_config's first, else the top's)."""
    archs = (config.get("text_config") or {}).get("architectures") or config.get("architectures") or []
    if not archs:
        raise Unsupported("gguf conversion needs config.json's `architectures` (llama.cpp's converter picks its "
                          "model class by it); this checkpoint names none")
    return str(archs[0])


def architecture_of(config: dict[str, Any], src: Path | None = None) -> str:
    """The HF architecture, or Unsupported when llama.cpp's converter has no text model class for it."""
    arch = hf_architecture(config)
    src = src or converter_dir()
    if arch not in converter_architectures(src):
        raise Unsupported(f"llama.cpp's converter (llama-cpp-python {src.name}) does not support architecture "
                          f"{arch} ({len(converter_architectures(src))} text architectures known, see "
                          f"conversion/__init__.py TEXT_MODEL_MAP)")
    return arch


def pre_tokenizer_by_structure(model_dir: Path) -> str | None:
    """llama.cpp's pre-tokenizer for tokenizer.json's own pre_tokenizer where it implements that one exactly,
    else None. Used only when the converter's hash table does not know the vocabulary."""
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        return None
    pre = json.loads(path.read_text()).get("pre_tokenizer") or {}
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space", False):
        return GPT2_PRE
    return None


def checkpoint_hash(model_dir: Path) -> str:
    """SHA-256 over the names and content digests of the checkpoint's files (adapters.meters.provenance's
    choice of files and its file hash, the one file hash of the project)."""
    model_dir = Path(model_dir)
    files = model_files(model_dir)
    if not any(f.suffix in (".safetensors", ".bin", ".pt", ".pth") for f in files):
        raise Unsupported(f"gguf conversion needs the checkpoint's weights (*.safetensors or *.bin); {model_dir} has none")
    h = hashlib.sha256()
    for path in files:
        h.update(str(path.relative_to(model_dir)).encode() + b"\0" + file_digest(path).encode() + b"\n")
    return h.hexdigest()


def conversion_notes(config: dict[str, Any], side: dict[str, Any]) -> list[str]:
    """What a reader of the results should know about this conversion."""
    notes = []
    if side.get("tokenizer_pre_source") == "structure":
        notes.append(f"tokenizer: llama.cpp's converter does not recognise this BPE vocabulary by hash, so its "
                     f"pre-tokenizer was chosen from tokenizer.json: '{side.get('tokenizer_pre')}' (a ByteLevel "
                     "pre-tokenizer with GPT-2's split regex, which llama.cpp's gpt-2 pre-tokenizer implements); "
                     "it matters only where llama.cpp tokenizes text (served prompts, chat)")
    sw = config.get("sliding_window")
    if (sw and config.get("use_sliding_window", True) and sw < config.get("max_position_embeddings", 0)
            and not side.get("sliding_window_in_gguf")):
        notes.append(f"sliding_window={sw} is not in the GGUF (llama.cpp's converter writes none for "
                     f"{side.get('source_architecture')}); outputs can differ from HF only for contexts longer "
                     f"than {sw} tokens")
    if side.get("config_added"):
        notes.append(f"config: the converter read a temporary copy of config.json with {side['config_added']} added "
                     "(names it asks for that transformers no longer writes; the checkpoint is untouched)")
    if side.get("converter_env_reason"):
        notes.append(f"converter environment: {side['converter_env_reason']}")
    return notes


# ----------------------------------------------------------------------------------------------
# conversion

def _atomic_target(final: Path) -> Path:
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=final.name + ".", suffix=".part", dir=final.parent)
    os.close(fd)
    return Path(tmp)


def _gguf_facts(path: Path) -> dict[str, Any]:
    """What the written GGUF says about its tokenizer and windows (read back with the gguf package)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    pre = reader.fields.get("tokenizer.ggml.pre")
    return {"tokenizer_pre": pre.contents() if pre is not None else None,
            "sliding_window_in_gguf": any(k.endswith(".attention.sliding_window") for k in reader.fields)}


_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit))(:.*)?$")
_STAGE_LINE = re.compile(r"^INFO:hf-to-gguf:(.+)$")


def failure_reason(log: str) -> str:
    """One line for a failed conversion: the exception's own last line (the last `SomethingError: ...` line
    after the last traceback, never a warning banner printed earlier) and the stage, the converter's last
    `INFO:hf-to-gguf:` line before the traceback."""
    lines = log.strip().splitlines()
    start = max((i for i, ln in enumerate(lines) if ln.startswith("Traceback (most recent call last)")), default=0)
    errors = [ln.strip() for ln in lines[start:] if _ERROR_LINE.match(ln.strip())]
    error = errors[-1] if errors else (lines[-1].strip() if lines else "no output")
    stages = [m.group(1).strip() for ln in lines[:start or len(lines)] if (m := _STAGE_LINE.match(ln.strip()))]
    stage = stages[-1] if stages else "starting the converter"
    return f"{error[:400]} (stage: {stage[:160]})"


def _failure(log: str, arch: str, model_dir: Path, rc: int, log_path: Path | None = None) -> Exception:
    reason = failure_reason(log)
    if "BPE pre-tokenizer was not recognized" in log and "NotImplementedError" in reason:
        return Unsupported(f"llama.cpp's converter does not recognise the BPE pre-tokenizer of {model_dir.name} "
                           "(its hash table, get_vocab_base_pre), and tokenizer.json's pre_tokenizer is not one "
                           "lossless-bench maps to a llama.cpp pre-tokenizer (a ByteLevel one with GPT-2's regex)")
    if f"Model {arch} is not supported" in log:
        return Unsupported(f"llama.cpp's converter does not support architecture {arch}")
    where = f"; full output in {log_path}" if log_path else ""
    return RuntimeError(f"llama.cpp's converter failed on {model_dir.name} (exit {rc}): {reason}{where}")


# config.json names llama.cpp 0.3.36's converter reads from the raw file that transformers (4.57 and 5) no longer
# writes: {architecture: the fields to add, from the config}. Applied only to a temporary copy (config.json rewritten, every other
# file a symlink), never to the user's checkpoint; tests/unit/test_gguf_config_map.py and the round-two tests in
# tests/engines/test_gguf_converter.py.
def _gpt2_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"n_ctx": cfg["n_positions"]} if "n_ctx" not in cfg and "n_positions" in cfg else {}


def _falcon_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    # classic Falcon's multi-query attention has one K/V head; transformers saves num_kv_heads = the query heads
    # beside multi_query: true, and the converter reshapes the fused qkv by num_kv_heads
    if cfg.get("multi_query") and not cfg.get("new_decoder_architecture") and cfg.get("num_kv_heads", 1) != 1:
        return {"num_kv_heads": 1}
    return {}


CONFIG_FIELDS = {"GPT2LMHeadModel": _gpt2_fields, "FalconForCausalLM": _falcon_fields}


def config_additions(arch: str, config: dict[str, Any]) -> dict[str, Any]:
    rule = CONFIG_FIELDS.get(arch)
    return rule(config) if rule else {}


def _checkpoint_for_converter(model_dir: Path, config: dict[str, Any], arch: str, tmp_root: Path) -> Path:
    """model_dir itself, or a temporary copy (same folder name) with config.json's renamed fields added."""
    extra = config_additions(arch, config)
    if not extra:
        return model_dir
    copy = tmp_root / model_dir.name
    copy.mkdir()
    for f in model_dir.iterdir():
        if f.name != "config.json":
            (copy / f.name).symlink_to(f.resolve())
    (copy / "config.json").write_text(json.dumps({**config, **extra}, indent=1))
    return copy


# architectures whose converter writes feed_forward_length = 4 x the width, whatever the config says
FFN_FOUR_TIMES = {"GPT2LMHeadModel": ("n_inner", "n_embd"), "PhiForCausalLM": ("intermediate_size", "hidden_size")}


def preflight(model_dir: Path, config: dict[str, Any], arch: str) -> None:
    """Unsupported before converting where the checkpoint has a property the converter cannot write: a GPT-2 or
    Phi feed-forward width other than 4 x the hidden size (the converter writes 4 x the width whatever the config
    says; llama.cpp then refuses ffn_down's shape), a Phi with query/key layer norms (qk_layernorm: the converter
    maps no tensor for them), a value llama.cpp's graph hardcodes otherwise (qwen3moe's
    top-k renormalisation, smollm3's NoPE step of 4: no GGUF key carries either), or a token the converter needs
    that the vocabulary lacks (GLM-4's converter looks up `<|endoftext|>` as its end-of-text token)."""
    if arch in FFN_FOUR_TIMES:
        ffn_key, width_key = FFN_FOUR_TIMES[arch]
        ffn, width = config.get(ffn_key), config.get(width_key)
        if ffn is not None and width is not None and ffn != 4 * width:
            raise Unsupported(f"llama.cpp's {arch} converter writes a feed-forward width of 4 x {width_key} "
                              f"({4 * width}); this checkpoint's {ffn_key} is {ffn}")
    if arch == "PhiForCausalLM" and config.get("qk_layernorm"):
        raise Unsupported("llama.cpp's phi2 converter maps no tensor for the query/key layer norms; this checkpoint's "
                          "qk_layernorm is true")
    if arch == "Qwen3MoeForCausalLM" and not config.get("norm_topk_prob", False):
        raise Unsupported("llama.cpp's qwen3moe always renormalises the top-k expert weights; this checkpoint's "
                          "norm_topk_prob is false")
    if arch == "SmolLM3ForCausalLM" and "no_rope_layers" in config:   # 1 = RoPE; llama.cpp: NoPE where (i+1) % 4 == 0
        if config["no_rope_layers"] != [int((i + 1) % 4 != 0) for i in range(len(config["no_rope_layers"]))]:
            raise Unsupported("llama.cpp's smollm3 hardcodes a NoPE layer every 4th layer (no GGUF key); this "
                              f"checkpoint's no_rope_layers is {config['no_rope_layers']}")
    if arch not in ("Glm4ForCausalLM", "Glm4MoeForCausalLM"):
        return
    tok = model_dir / "tokenizer.json"
    if tok.is_file():
        data = json.loads(tok.read_text())
        known = set((data.get("model") or {}).get("vocab") or {}) | {a["content"] for a in data.get("added_tokens", [])}
        if "<|endoftext|>" not in known:
            raise Unsupported(f"llama.cpp's GLM-4 converter needs the token <|endoftext|> in the vocabulary "
                              f"(its end-of-text token); {model_dir.name}'s tokenizer has none")


def convert_hf_to_gguf(model_dir: str | os.PathLike, out_path: str | os.PathLike,
                       out_type: str = "f32") -> tuple[Path, dict[str, Any]]:
    """Write a GGUF for an HF checkpoint directory with llama.cpp's converter (no caching; see
    `converted_gguf`), and `<out>.json` beside it; returns (path, what the side file says)."""
    if out_type not in OUT_TYPES:
        raise ValueError(f"out_type must be one of {OUT_TYPES}, got {out_type!r}")
    model_dir, out_path = Path(model_dir), Path(out_path)
    src = converter_dir()
    config = read_config(model_dir)
    arch = architecture_of(config, src)
    preflight(model_dir, config, arch)
    pre = pre_tokenizer_by_structure(model_dir)
    tmp = _atomic_target(out_path)
    report = tmp.with_name(tmp.name + ".report")
    side_tmp = _atomic_target(out_path.with_suffix(".json"))
    python, _ = converter_python()
    staging = tempfile.TemporaryDirectory(prefix="bench-convert-")
    given = _checkpoint_for_converter(model_dir, config, arch, Path(staging.name))
    argv = [python, str(CHILD), str(src), str(given), str(tmp), out_type, str(report), *([pre] if pre else [])]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONNOUSERSITE": "1"}
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                              cwd=str(src))
        if proc.returncode != 0 or not report.is_file():
            log_path = out_path.with_name(out_path.name + ".convert.log")
            log_path.write_text(proc.stdout)
            sys.stderr.write(f"llama.cpp's converter failed on {model_dir}; its output:\n{proc.stdout}\n")
            raise _failure(proc.stdout, arch, model_dir, proc.returncode, log_path)
        used = json.loads(report.read_text())
        added = {"config_added": config_additions(arch, config)} if given != model_dir else {}
        side = {**converter_identity(src), "source_architecture": arch, **added, "out_type": out_type, **_gguf_facts(tmp),
                "tokenizer_pre_source": {"hash": "converter", "given": "structure"}.get(
                    used["tokenizer_pre_source"], used["tokenizer_pre_source"])}
        side_tmp.write_text(json.dumps(side, indent=1))
        os.replace(side_tmp, out_path.with_suffix(".json"))
        os.replace(tmp, out_path)
    finally:
        for leftover in (tmp, report, side_tmp):
            leftover.unlink(missing_ok=True)
        staging.cleanup()
    return out_path, side


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
    src = converter_dir()
    config = read_config(model_dir)
    arch = architecture_of(config, src)  # Unsupported before hashing gigabytes
    preflight(model_dir, config, arch)
    version = converter_identity(src)["converter_version"]
    added = config_additions(arch, config)   # what the converter reads is part of the key
    extra = f"|{json.dumps(added, sort_keys=True)}" if added else ""
    key = hashlib.sha256(f"{checkpoint_hash(model_dir)}|{version}|{out_type}{extra}".encode()).hexdigest()[:24]
    path = _cache_root(cache_dir) / f"{model_dir.name}-{key}-{out_type}.gguf"
    if path.is_file() and path.with_suffix(".json").is_file():
        return path, True
    return convert_hf_to_gguf(model_dir, path, out_type)[0], False


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


def quantize_gguf(src: str | os.PathLike, dst: str | os.PathLike, level: str, nthread: int = 0,
                  overrides: dict[str, str] | None = None) -> Path:
    """llama.cpp's own quantizer (llama_model_quantize) from an F32 GGUF, written atomically. `overrides`:
    tensor-name regex -> ggml type name ("q8_0", "q4_0", "f32", ...), llama.cpp's per-tensor type overrides
    (`tt_overrides`, the first matching pattern wins). They act only where the quantizer quantizes, so a file with
    one group quantized is `level` plus a negative lookahead back to f32, e.g. q8_0 with {"^(?!blk\\.3\\.)": "f32"}.

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
        if overrides:   # a null-pattern entry ends the array; the array lives until the call returns
            entries = [llama_cpp.llama_model_tensor_override(pattern.encode(), getattr(llama_cpp, f"GGML_TYPE_{t.upper()}"))
                       for pattern, t in overrides.items()]
            table = (llama_cpp.llama_model_tensor_override * (len(entries) + 1))(*entries)
            params.tt_overrides = ctypes.cast(table, ctypes.POINTER(llama_cpp.llama_model_tensor_override))
        with captured_llama_logs(logs):
            rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
        if rc != 0:
            tail = "".join(logs).strip().splitlines()[-3:]
            raise RuntimeError(f"llama_model_quantize({src} -> {level}) returned {rc}: {' | '.join(tail)}")
        fallback = [ln.split("WARNING:", 1)[1].strip() for ln in logs if "fallback quantization" in ln]
        side = {"level": level, "overrides": overrides or None, "source": Path(src).name, "llama_cpp_python": llama_cpp.__version__,
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
    facts: dict[str, Any] = {"gguf_origin": "converted", "gguf_level": quantization}
    if quantization in LEVEL_OUT_TYPE:
        path, hit = converted_gguf(source, LEVEL_OUT_TYPE[quantization], cache_dir)
        converted = path
    elif quantization in QUANT_LEVELS:
        path, hit = quantized_gguf(source, quantization, cache_dir)
        converted, _ = converted_gguf(source, "f32", cache_dir)   # a cache hit: the quantizer's source
        facts["quantized_from"] = "f32"
        side = path.with_suffix(".json")
        if side.is_file() and json.loads(side.read_text()).get("fallback"):
            facts["quantize_fallback"] = json.loads(side.read_text())["fallback"]
    else:
        raise Unsupported(f"llamacpp cannot run quantization {quantization}")
    conversion = json.loads(converted.with_suffix(".json").read_text())
    for key in ("converter", "converter_version", "converter_gguf_py", "converter_transformers", "source_architecture",
                "tokenizer_pre", "tokenizer_pre_source"):
        facts[key] = conversion.get(key)
    facts["gguf_cache_hit"] = hit
    facts["gguf_file_type"] = FTYPES[quantization]
    notes = conversion_notes(config, conversion)
    if notes:
        facts["conversion_notes"] = notes
    return path, facts
