"""The culprit search over a cell's suspects: which smallest set of them, moved to the baseline's side, makes
the cell lossless (the goal: `identical` or `lossless`; near-lossless is not the goal, since near-lossless is
what is being explained).

Round 1 runs together: the cell as it is (does its verdict reproduce in the probe run?), every suspect moved
(does anything restore it? if not, the engine itself differs) and each suspect alone. A suspect that restores
alone is a culprit of size 1 (every such suspect is named). Otherwise delta debugging (Zeller's ddmin) over the
suspects finds a 1-minimal set: moving it restores, moving any one of it back does not. So two flags that only
matter together are found. Its probes run one per round, in order, stopping at the first that restores: fewer
probes than a round of every subset, each a cell of its own (one engine load). Monotony is assumed
(a superset of a restoring set restores); where it does not hold ddmin still returns a set that restores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.store.explain_file import Outcome, Probe

# (the sets to probe, with their phase) -> their probes, in the same order; probed sets come from the cache
Prober = Callable[[list[tuple[frozenset[str], str]]], list[Probe]]


class OutOfProbes(Exception):
    """The probe budget would be exceeded by the next round."""


@dataclass
class Found:
    outcome: Outcome
    culprits: list[list[str]] = field(default_factory=list)
    summary: str = ""


class _Budget:
    def __init__(self, probe: Prober, max_probes: int):
        self.probe, self.max_probes, self.seen = probe, max_probes, set()

    def __call__(self, sets: list[tuple[frozenset[str], str]]) -> list[Probe]:
        new = {s for s, _ in sets} - self.seen
        if len(self.seen) + len(new) > self.max_probes:
            raise OutOfProbes
        self.seen |= new
        return self.probe(sets)


def _split(items: list[str], n: int) -> list[list[str]]:
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (i < extra)
        out.append(items[start:end])
        start = end
    return [p for p in out if p]


def _first_restoring(sets: list[list[str]], probe: Prober) -> list[str] | None:
    """The first set that restores, probing one at a time and stopping there (fewer probes than a round of all)."""
    for s in sets:
        if probe([(frozenset(s), "ddmin")])[0].restores:
            return s
    return None


def ddmin(suspects: list[str], probe: Prober) -> list[str]:
    """A 1-minimal subset of `suspects` (whose whole set restores) that restores."""
    current, n = list(suspects), 2
    while len(current) >= 2:
        parts = _split(current, n)
        hit = _first_restoring(parts, probe)
        if hit is not None:
            current, n = hit, 2
            continue
        if len(parts) > 2:   # with two parts each complement is the other part, just probed
            hit = _first_restoring([[x for x in current if x not in p] for p in parts], probe)
            if hit is not None:
                current, n = hit, max(n - 1, 2)
                continue
        if n >= len(current):
            break
        n = min(2 * n, len(current))
    return current


def _verdict(p: Probe) -> str:
    if p.status != "ok":
        return f"{p.status}" + (f" ({p.reason})" if p.reason else "")
    return f"{p.verdict}" + (f" ({p.verdict_reason})" if p.verdict_reason else "")


def search(suspects: list[str], probe: Prober, max_probes: int = 32) -> Found:
    """Run the search; `suspects` in the order they are named."""
    if not suspects:
        return Found("no-suspects", summary="none of the declared flags, the batch size or the quantization differs "
                     "from the baseline's side: the engine itself differs")
    budget = _Budget(probe, max_probes)
    everything = frozenset(suspects)
    first = [(frozenset(), "as-is"), (everything, "all"), *((frozenset([s]), "one-at-a-time") for s in suspects)]
    try:
        probes = budget(first)
    except OutOfProbes:
        return Found("budget", summary=f"the first round needs {len(set(s for s, _ in first))} probes, more than "
                     f"--max-probes {max_probes}")
    as_is, moved_all, alone = probes[0], probes[1], probes[2:]
    if as_is.status != "ok" or as_is.verdict is None:
        return Found("failed", summary=f"the cell as it is did not give a verdict in the probe run: {_verdict(as_is)}")
    if as_is.restores:
        return Found("not-reproduced", summary=f"in the probe run the cell as it is is {as_is.verdict}: its verdict "
                     "in the run did not reproduce (a metric near its threshold, or noise)")
    singles = [[s] for s, p in zip(suspects, alone) if p.restores]
    if singles:
        names = " or ".join(s[0] for s in singles)
        return Found("culprit", singles, f"moving {names} to the baseline's side alone restores "
                     f"{next(p.verdict for p in alone if p.restores)}")
    if not moved_all.restores:
        if moved_all.status != "ok":
            return Found("failed", summary=f"with every suspect moved the cell did not run: {_verdict(moved_all)}")
        return Found("engine", summary=f"no move restores lossless: with every suspect moved ({', '.join(suspects)}) the "
                     f"cell is still {_verdict(moved_all)}, so the engine itself differs")
    try:
        smallest = ddmin(suspects, budget)
    except OutOfProbes:
        return Found("budget", [list(suspects)], f"the probe budget ({max_probes}) ran out during delta debugging; "
                     f"moving all of {', '.join(suspects)} restores {moved_all.verdict}")
    restored = budget([(frozenset(smallest), "ddmin")])[0]     # probed already: from the cache
    return Found("culprit", [smallest], f"moving {' + '.join(smallest)} together to the baseline's side restores "
                 f"{restored.verdict}; moving any one of them back loses it")
