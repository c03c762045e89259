"""Which engine group, or part of one, runs on which node next: the driver's own list scheduler.

Pure (no Ray): the scheduler (orchestrator/execution/scheduling/scheduler.py) pins each part it gets from here to its node,
and benchmarks/simulate_schedule.py runs the same object against simulated durations. It sees only
estimates (orchestrator/execution/scheduling/estimate.py), never how long anything really takes.

Nodes fall into types: nodes offering the same resources (GPUs, CPUs, env_<framework> markers...).
`units` are what a part takes of its node: GPUs, or CPUs in a run without GPUs.

 1. Bound. T = the estimated lower bound on the makespan if groups could be cut anywhere: the
    largest of, for every set of node types, the estimated unit-seconds of the groups that can only
    run there over their units, and of one cell plus its group's load.
 2. Split. A group estimated longer than T would alone end after every other group could: it is cut
    into the fewest parts each estimated within T (cells dealt longest first to the emptiest part,
    each part in the group's cell order). Each part pays one more engine load, so nothing else is
    cut, and T is raised (by at most 10% a round) until the bound of the parts, extra loads counted,
    is within it: the smallest T the cuts themselves do not push up.
 3. Home. Each part gets the node type it should run on: a part only one type can host goes there;
    the others, largest first, go to the type whose estimated finish (work/units) is then lowest,
    avoiding types whose units already each hold a long part (over T/2: two would not fit in T).
 4. Order. Long parts (over T/2) first, longest first: they set the makespan if they start late.
    The rest by (seconds + LOAD_WEIGHT x load + RISK_Z x spread) x sqrt(units): a wide part waits for
    a whole node to free up, so it goes before a narrow one of the same length (otherwise narrow parts
    keep taking the freed GPUs); a part whose load is much of it cannot be shared out at the end (a
    thief pays the load again), so it goes before one that can; and one whose estimate is uncertain
    (its standard deviation in seconds, from the estimate's log-space spreads) before a sure one, so
    the run ends on short, well-known, cheaply stolen work. Inside a part, cells go longest first: its
    unstarted tail is then its shortest cells, the ones a thief can balance finely.
 5. Place. The first part in that order that fits a node of its home type with free room goes to the
    one it fills most (best fit: whole nodes stay free for wide parts); a node type with no home work
    left takes other types' parts it can run.
 6. Steal (at run time, `steal`/`stolen`). Once no waiting part could use a node with free units, it
    takes the unstarted tail of a running part it can host, the one projected to end last: what is
    left of its load and running cell plus its unstarted cells, each estimate scaled by measured /
    estimated over everything the run has measured (loads and cells apart) and, for the cells, by
    the part's own measured speed (worth PRIOR_CELLS cells against that). The tail moved is the one
    that ends victim and thief soonest, the thief paying the config's load again (as measured where
    the victim loaded); only when that beats the victim's projected end by MIN_GAIN_S and MIN_GAIN
    of what it has left. The caller asks the victim for those cells; the ones it gives up (it may
    have started some meanwhile) become a part of their own on that node.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from orchestrator.matrix.placement import Need, fits

# Resources that differ between nodes of one type (per-node ids, memory sizes) are not part of its type.
NOT_A_TYPE = ("memory", "object_store_memory")
LONG = 0.5          # a part over LONG x T is long
MAX_POOLS = 4096    # node-type sets the bound looks at (all unions of the sets groups can use, up to this)
PRIOR_CELLS = 2.0   # a running part's own measured speed counts against the run's calibration as this many cells
MIN_GAIN_S, MIN_GAIN = 5.0, 0.05   # a steal must end the victim's work this much sooner (s; share of what it has left)
ROUGH_S = 1e-6     # s: more than a rough end (an end summed before scaling) can be off from the exact one
MAX_ROUNDS = 20     # of raising T until the parts cut at T, with their extra loads, fit within it
LOAD_WEIGHT = 0.5   # a part's load counts this much again in its rank (0.25-1 within 1% in the simulation)
RISK_Z = 1.5        # and its spread this many standard deviations (1-2 were within 1% in the simulation)


@dataclass(eq=False)
class Work:
    """An engine group or a part of one: which of its cells, their estimates and what it asks of a node."""

    key: Any                        # the caller's handle (a GroupJob; the simulation's group)
    need: Need
    load_s: float
    cell_s: tuple[float, ...]
    cells: tuple[int, ...] = ()     # indices into the group's cells (default: all, in order)
    splittable: bool = True
    rank: tuple = field(default=(), compare=False)
    load_sigma: float = 0.0         # how far off the estimates may be (log-space sigma; 0: exact)
    cell_sigma: tuple[float, ...] = ()   # per cell (default: 0 each)

    def __post_init__(self):
        if not self.cells:
            self.cells = tuple(range(len(self.cell_s)))
        if not self.cell_sigma:
            self.cell_sigma = (0.0,) * len(self.cell_s)

    @property
    def seconds(self) -> float:
        return self.load_s + sum(self.cell_s)

    @property
    def spread(self) -> float:
        """The standard deviation of its seconds (s), each estimate a LogNormal median with its sigma."""
        def var(median, sigma):
            return median * median * math.exp(sigma * sigma) * (math.exp(sigma * sigma) - 1)
        return math.sqrt(var(self.load_s, self.load_sigma) + sum(map(var, self.cell_s, self.cell_sigma)))

    def part(self, indices: list[int]) -> "Work":
        return Work(self.key, self.need, self.load_s, tuple(self.cell_s[i] for i in indices),
                    tuple(self.cells[i] for i in indices), self.splittable, load_sigma=self.load_sigma,
                    cell_sigma=tuple(self.cell_sigma[i] for i in indices))

    def longest_first(self) -> "Work":
        order = sorted(range(len(self.cell_s)), key=lambda i: -self.cell_s[i])
        return self if order == list(range(len(order))) else self.part(order)


@dataclass
class Progress:
    """What the driver has seen of a running part, on its own clock (seconds): its task began at
    `started`, its engine loaded in `load_s` (None: still loading), its first len(cell_s) cells (in the
    part's order) took cell_s, and the cell running now began at `cell_since` (None: none runs)."""

    started: float
    load_s: float | None = None
    cell_s: list[float] = field(default_factory=list)
    cell_since: float | None = None

    @property
    def begun(self) -> int:
        """Cells started (finished or running): the rest can still be taken by another node."""
        return len(self.cell_s) + (self.cell_since is not None)


def node_type(resources: dict[str, float]) -> tuple:
    return tuple(sorted((k, round(v, 3)) for k, v in resources.items()
                        if k not in NOT_A_TYPE and not k.startswith("node:") and v))


def split(work: Work, limit: float) -> list[Work]:
    """The fewest parts each estimated within `limit`; the work itself when it is within or has one cell."""
    n = len(work.cell_s)
    if work.seconds <= limit or n < 2 or not work.splittable:
        return [work]
    room = max(limit - work.load_s, 1e-9)
    k = min(n, max(2, math.ceil(sum(work.cell_s) / room)))
    while True:
        bins, totals = [[] for _ in range(k)], [0.0] * k
        for i in sorted(range(n), key=lambda i: -work.cell_s[i]):
            b = min(range(k), key=totals.__getitem__)
            bins[b].append(i)
            totals[b] += work.cell_s[i]
        if max(totals) <= room or k >= n:
            return [work.part(sorted(b)) for b in bins if b]
        k += 1


def rank(p: Work, bound: float, units: float) -> tuple:
    long = p.seconds > LONG * bound
    if long:
        return (0, -p.seconds)
    return (1, -(p.seconds + LOAD_WEIGHT * p.load_s + RISK_Z * p.spread) * math.sqrt(max(units, 1e-9)))


class Dispatcher:
    def __init__(self, nodes: dict[str, dict[str, float]], works: list[Work], split_groups: bool = True,
                 steal_cells: bool = True):
        self.steal_cells = steal_cells
        self.stealing: dict[Work, str] = {}   # victim -> node reserved for its thief, until `stolen`
        self.seen = [0.0, 0.0, 0.0, 0.0]      # finished parts: estimated, measured load s; estimated, measured cell s
        self.unit = "GPU" if any(w.need.gpus for w in works) else "CPU"
        self.total: dict[str, dict[str, float]] = {}
        self.free: dict[str, dict[str, float]] = {}
        self.type_of: dict[str, tuple] = {}
        self.open: set[str] = set()          # nodes with free units
        self.running: dict[Work, str] = {}
        self.pending: dict[tuple, list] = {}  # (home type, need) -> heap of (rank, seq, work)
        self.home: dict[Work, tuple] = {}
        self.waiting: dict[tuple, int] = {}   # home type -> parts not started
        self.capacity: dict[tuple, float] = {}
        self._known: dict[Work, tuple] = {}  # per running part: what _facts made of its last progress
        self.lost: list[Work] = []            # parts no node alive can take any more (the caller reports them)
        self._seq = itertools.count()
        self.set_nodes(nodes)
        placeable = [w for w in works if self.types_for(w.need)]
        self.bound = self.estimated_bound(placeable)
        self.parts = placeable
        for _ in range(MAX_ROUNDS if split_groups else 0):
            self.parts = [p for w in placeable for p in split(w, self.bound)]
            with_cuts = self.estimated_bound(self.parts)      # the loads the cuts add count too
            if with_cuts <= self.bound * 1.001:
                break
            self.bound = min(with_cuts, self.bound * 1.1)
        self.parts = [p.longest_first() for p in self.parts]
        for p in self.parts:
            p.rank = rank(p, self.bound, self.units(p.need))
        self._assign_homes(self.parts)

    # -- nodes and types ---------------------------------------------------------------------------

    def set_nodes(self, nodes: dict[str, dict[str, float]]) -> None:
        """The nodes alive now: new ones join, gone ones leave (what ran there comes back via requeue)."""
        for n in set(self.total) - set(nodes):
            del self.total[n], self.free[n], self.type_of[n]
            self.open.discard(n)
        for n, r in nodes.items():
            if n not in self.total:
                self.total[n], self.free[n], self.type_of[n] = dict(r), dict(r), node_type(r)
                self.open.add(n)
        self.capacity: dict[tuple, float] = {}
        for n, t in self.type_of.items():
            self.capacity[t] = self.capacity.get(t, 0.0) + self.total[n].get(self.unit, 0.0)
        self._types_for: dict[Need, list[tuple]] = {}
        for (home, need) in [k for k, h in self.pending.items() if h and k[0] not in self.capacity]:
            for _, _, p in self.pending.pop((home, need)):   # their node type is gone: rehome them
                self.waiting[home] -= 1
                self.requeue(p)

    def units(self, need: Need) -> float:
        return need.as_resources().get(self.unit, 0.0)

    def types_for(self, need: Need) -> list[tuple]:
        if need not in self._types_for:
            self._types_for[need] = [t for t in self.capacity if fits(need, dict(t))]
        return self._types_for[need]

    # -- planning ----------------------------------------------------------------------------------

    def estimated_bound(self, works: list[Work]) -> float:
        by_set: dict[frozenset, float] = {}
        for w in works:
            key = frozenset(self.types_for(w.need))
            by_set[key] = by_set.get(key, 0.0) + w.seconds * self.units(w.need)
        pools = set(by_set)
        for s in list(by_set):
            for t in list(pools):
                if len(pools) < MAX_POOLS:
                    pools.add(s | t)
        best = max((w.load_s + max(w.cell_s, default=0.0) for w in works), default=0.0)
        for pool in pools:
            units = sum(self.capacity[t] for t in pool)
            if units > 0:
                best = max(best, sum(v for s, v in by_set.items() if s <= pool) / units)
        return best

    def _assign_homes(self, parts: list[Work]) -> None:
        level = {t: 0.0 for t in self.capacity}       # estimated busy time per unit of each type
        long_units = {t: 0.0 for t in self.capacity}
        flexible = []
        for p in parts:
            types = self.types_for(p.need)
            if len(types) > 1:
                flexible.append(p)
                continue
            self._note(p, types[0], level, long_units)
        for p in sorted(flexible, key=lambda p: -p.seconds * self.units(p.need)):
            long, u = p.seconds > LONG * self.bound, self.units(p.need)
            area = p.seconds * u

            def cost(t):
                crowded = long and long_units[t] + u > self.capacity[t]
                return crowded, level[t] + area / max(self.capacity[t], 1e-9)

            self._note(p, min(self.types_for(p.need), key=cost), level, long_units)

    def _note(self, p: Work, t: tuple, level: dict, long_units: dict) -> None:
        level[t] += p.seconds * self.units(p.need) / max(self.capacity[t], 1e-9)
        if p.seconds > LONG * self.bound:
            long_units[t] += self.units(p.need)
        self._push(p, t)

    def _push(self, p: Work, home: tuple) -> None:
        self.home[p] = home
        heapq.heappush(self.pending.setdefault((home, p.need), []), (p.rank, next(self._seq), p))
        self.waiting[home] = self.waiting.get(home, 0) + 1

    # -- running -----------------------------------------------------------------------------------

    def step(self) -> list[tuple[Work, str]]:
        """Parts to start now, each with its node (their resources are taken)."""
        out = []
        while self.open:
            tops = sorted((h[0], home, need) for (home, need), h in self.pending.items() if h)
            for _, home, need in tops:
                node = self._best_fit(need, [home])
                if node is None:
                    idle = [t for t in self.types_for(need) if t != home and not self.waiting.get(t)]
                    node = self._best_fit(need, idle) if idle else None
                if node is not None:
                    p = heapq.heappop(self.pending[(home, need)])[2]
                    self.waiting[home] -= 1
                    out.append((p, self._take(p, node)))
                    break
            else:
                break
        return out

    def _best_fit(self, need: Need, types: list[tuple]) -> str | None:
        u, best = self.units(need), None
        for n in (self.open if u > 0 else self.total):
            if self.type_of[n] in types and fits(need, self.free[n]):
                left = self.free[n].get(self.unit, 0.0) - u
                if best is None or (left, n) < best:
                    best = (left, n)
        return best[1] if best else None

    def _take(self, p: Work, node: str) -> str:
        self.running[p] = self._take_units(p.need, node)
        return node

    def finished(self, p: Work, progress: Progress | None = None) -> None:
        """p ended; with its progress, what it measured calibrates the estimates of the parts still running."""
        if progress is not None:
            self._observe(p, progress, self.seen)
        self._known.pop(p, None)
        self._give_back(p.need, self.running.pop(p))

    def requeue(self, p: Work) -> bool:
        """A part lost with its node (or its worker): back to waiting, homed on a type that is still
        there. False (and in `lost`) when no node alive can take it."""
        if p in self.running:
            self.finished(p)
        types = self.types_for(p.need)
        if not types:
            self.lost.append(p)
            return False
        self._push(p, self.home.get(p) if self.home.get(p) in types else max(types, key=self.capacity.get))
        return True

    # -- stealing cells at run time -------------------------------------------------------------------

    def steal(self, now: float, progress: dict[Work, Progress]) -> list[tuple[Work, tuple[int, ...], str]]:
        """Once nothing waiting can use a node with free units, it takes the unstarted tail of a running part
        projected to end late: (victim, its cells to withdraw, node). The node's units are taken until
        `stolen` says which of those cells the victim gave up (it may have started some meanwhile)."""
        if not self.steal_cells or not self.running:
            return []
        usable = self._usable()
        nodes = sorted((n for n in self.open if self.type_of[n] not in usable),
                       key=lambda n: (-self.free[n].get(self.unit, 0.0), n))
        if not nodes:
            return []
        # what each running part has reported, and the run's calibration: measured / estimated over every
        # load and cell seen so far (1 before any), the estimates' bias (as _observe adds, into a copy of self.seen)
        running, stealing, known, facts = self.running, self.stealing, self._known, self._facts
        load_est, load_seen, cell_est, cell_seen = self.seen
        rows = []
        for p, pr in progress.items():
            if p in running:
                f = known.get(p)
                if f is None or f[0] is not pr or f[1] is not p.cell_s or f[2] != len(pr.cell_s) \
                        or f[3] != pr.cell_since or f[4] != pr.load_s:
                    f = facts(p, pr)
                else:
                    f = f[5]
                if pr.load_s is not None:
                    load_est += p.load_s
                    load_seen += pr.load_s
                cell_est += f[0]
                cell_seen += f[1]
                if f[4] and p not in stealing and p.splittable:
                    rows.append((p, pr, f))
        k_load = load_seen / load_est if load_est > 0 else 1.0
        k_cell = cell_seen / cell_est if cell_est > 0 else 1.0
        # Only the parts some of these nodes could host are victims at all, and of those only the ones a
        # cut could pay for: a thief that loads again gains at most half of (end - now - load), whatever
        # the cut, so a part whose rough end (its tail's estimates summed, then scaled) says that falls
        # short of the gain asked has no cut (_best_cut would say None), and its exact end is not needed.
        hosts: dict[Need, set] = {}
        victim_needs: dict[Need, bool] = {}
        same: dict[int, Need] = {}               # id of a need -> the equal need met first
        hostable: dict[int, bool] = {}           # per need (its id in `same`): some of the nodes could host it
        latest: dict[int, float] = {}            # per need (its id in `same`), the latest rough end so far
        near = []     # the candidates that pay or were then near their need's latest end, in the progress' order
        for i, (p, pr, f) in enumerate(rows):    # the splittable running parts with cells not begun, not asked already
            need = same.get(id(p.need))
            if need is None:
                need = same[id(p.need)] = next((n for n in victim_needs if n == p.need), p.need)
                if need not in victim_needs:
                    types = hosts[need] = set(self.types_for(need))
                    victim_needs[need] = any(self.type_of[n] in types and fits(need, self.free[n]) for n in nodes)
                hostable[id(need)] = victim_needs[need]
            if not hostable[id(need)]:
                continue
            # at, k as _start_and_speed says (the same arithmetic, inline: this runs for every candidate)
            est_done, measured, mean, tail, _ = f
            k = (measured + PRIOR_CELLS * mean * k_cell) / (est_done + PRIOR_CELLS * mean) if mean > 0 else k_cell
            at = now if pr.load_s is not None else now + max(p.load_s * k_load - (now - pr.started), 0.0)
            if pr.cell_since is not None:
                at += max(p.cell_s[len(pr.cell_s)] * k - (now - pr.cell_since), 0.0)
            r = at + k * tail
            load = pr.load_s if pr.load_s is not None else p.load_s * k_load
            pays = (r - now - load) / 2 >= max(MIN_GAIN_S, MIN_GAIN * (r - now)) - ROUGH_S
            top = latest.get(id(need), -math.inf)
            if r > top:
                latest[id(need)] = top = r
            if pays or r >= top - ROUGH_S:   # (the latest end only grows: a part under it now stays under)
                near.append((i, p, pr, r, pays, id(need)))
        ends: dict[Work, tuple] = {}
        viable: list[Work] = []
        first: dict[Need, tuple] = {}   # per need: (-its latest end, where that part is in the progress' order)
        for i, p, pr, r, pays, need_id in near:
            if pays or r >= latest[need_id] - ROUGH_S:     # a victim, or maybe the part that ends its need last
                ends[p] = self._projected_end(p, pr, now, k_load, k_cell)
                key = (-ends[p][0], i)
                if p.need not in first or key < first[p.need]:
                    first[p.need] = key
                if pays:
                    viable.append(p)
        # the needs in the order a sort of every candidate by its end would first meet them (their latest
        # end, ties in the progress' order), each with its victims latest end first
        by_need: dict[Need, list[Work]] = {}
        for need in sorted({p.need for p in viable}, key=first.__getitem__):
            by_need[need] = []
        for p in sorted(viable, key=lambda p: -ends[p][0]):
            by_need[p.need].append(p)
        cuts: dict[Work, tuple | None] = {}
        out = []
        for node in nodes:
            if not by_need:
                break      # no victim left for any node
            best, empty = None, []
            node_type_, free = self.type_of[node], self.free[node]
            for need, victims in by_need.items():
                if node_type_ not in hosts[need] or not fits(need, free):
                    continue
                while victims and (victims[0] in self.stealing or not cuts.setdefault(
                        victims[0], self._best_cut(victims[0], progress[victims[0]], now, ends[victims[0]], k_load))):
                    victims.pop(0)
                if not victims:
                    empty.append(need)
                elif best is None or ends[victims[0]][0] > ends[best][0]:
                    best = victims[0]
            for need in empty:
                del by_need[need]
            if best is not None:
                self.stealing[best] = self._take_units(best.need, node)
                out.append((best, cuts[best], node))
        return out

    def _usable(self) -> set[tuple]:
        """Node types some waiting part could run on."""
        return {t for (home, need), h in self.pending.items() if h for t in self.types_for(need)}

    def could_steal(self) -> bool:
        """Two parts of some group could ever run at once (else there is no node to steal to)."""
        return self.steal_cells and any(
            sum(math.floor(self.total[n].get(self.unit, 0.0) / max(self.units(need), 1e-9) + 1e-9)
                for n in self.total if fits(need, self.total[n])) >= 2 for need in {p.need for p in self.parts if p.splittable})

    def can_steal(self) -> bool:
        """A node has free units no waiting part could use, and parts are running."""
        if not self.steal_cells or not self.running:
            return False
        usable = self._usable()
        return any(self.type_of[n] not in usable for n in self.open)

    def stolen(self, victim: Work, withdrawn: tuple[int, ...], node: str) -> Work | None:
        """The victim gave up `withdrawn` (cell indices of its group): they become a part running on `node`
        (None, and the node's units back, when it gave up none)."""
        self.stealing.pop(victim, None)
        gone = set(withdrawn)
        if not gone:
            self._give_back(victim.need, node)
            return None
        keep = [i for i, c in enumerate(victim.cells) if c not in gone]
        take = [i for i, c in enumerate(victim.cells) if c in gone]
        thief = victim.part(take)
        victim.cells, victim.cell_s = tuple(victim.cells[i] for i in keep), tuple(victim.cell_s[i] for i in keep)
        victim.cell_sigma = tuple(victim.cell_sigma[i] for i in keep)
        self.running[thief] = node
        return thief

    def _observe(self, p: Work, pr: Progress, into: list[float]) -> None:
        if pr.load_s is not None:
            into[0] += p.load_s
            into[1] += pr.load_s
        into[2] += sum(p.cell_s[:len(pr.cell_s)])
        into[3] += sum(pr.cell_s)

    def _facts(self, p: Work, pr: Progress) -> tuple[float, float, float, float, bool]:
        """(estimated seconds of p's finished cells, their measured seconds, p's mean cell estimate, the
        estimated seconds of its unstarted cells, whether it has any): the same until p or its progress
        changes (steal looks them up in self._known itself)."""
        f = self._known.get(p)
        if f is not None and f[0] is pr and f[1] is p.cell_s and f[2] == len(pr.cell_s) and f[3] == pr.cell_since \
                and f[4] == pr.load_s:
            return f[5]
        cells = p.cell_s
        facts = (sum(cells[:len(pr.cell_s)]), sum(pr.cell_s), sum(cells) / max(len(cells), 1), sum(cells[pr.begun:]),
                 pr.begun < len(p.cells))
        self._known[p] = (pr, cells, len(pr.cell_s), pr.cell_since, pr.load_s, facts)
        return facts

    def _start_and_speed(self, p: Work, pr: Progress, f: tuple, now: float, k_load: float,
                         k_cell: float) -> tuple[float, float]:
        """(when p's begun cells are projected to end, the factor on its cells' estimates): its own measured
        speed, weighted as PRIOR_CELLS cells at the run's calibration, corrects its estimates. f: its _facts."""
        est_done, measured, mean = f[:3]
        k = (measured + PRIOR_CELLS * mean * k_cell) / (est_done + PRIOR_CELLS * mean) if mean > 0 else k_cell
        at = now if pr.load_s is not None else now + max(p.load_s * k_load - (now - pr.started), 0.0)
        if pr.cell_since is not None:
            at += max(p.cell_s[len(pr.cell_s)] * k - (now - pr.cell_since), 0.0)
        return at, k

    def _projected_end(self, p: Work, pr: Progress, now: float, k_load: float, k_cell: float) -> tuple[float, float, list[float]]:
        """(when p is projected to end, when its begun cells are, its unstarted cells' seconds)."""
        at, k = self._start_and_speed(p, pr, self._facts(p, pr), now, k_load, k_cell)
        rest = [c * k for c in p.cell_s[pr.begun:]]
        return at + sum(rest), at, rest

    def _best_cut(self, p: Work, pr: Progress, now: float, end: tuple, k_load: float) -> tuple[int, ...] | None:
        """The tail whose move ends both parts soonest, when that beats the victim's end by enough to pay a load."""
        whole, at, rest = end
        load = pr.load_s if pr.load_s is not None else p.load_s * k_load   # a measured load of this config
        best, keep, tail, kept = whole, None, sum(rest), 0.0
        for j in range(len(rest)):    # the victim keeps rest[:j], the thief loads and runs rest[j:]
            finish = max(at + kept, now + load + tail - kept)
            if finish < best:
                best, keep = finish, j
            kept += rest[j]
        if keep is None or whole - best < max(MIN_GAIN_S, MIN_GAIN * (whole - now)):
            return None
        return tuple(p.cells[pr.begun + keep:])

    def _take_units(self, need: Need, node: str) -> str:
        for k, v in need.as_resources().items():
            self.free[node][k] = self.free[node].get(k, 0.0) - v
        if self.free[node].get(self.unit, 0.0) <= 1e-9:
            self.open.discard(node)
        return node

    def _give_back(self, need: Need, node: str) -> None:
        if node in self.free:
            for k, v in need.as_resources().items():
                self.free[node][k] += v
            self.open.add(node)

    def idle(self) -> bool:
        return not self.running and not any(self.pending.values())
