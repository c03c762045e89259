"""Work stealing between the driver and the parts running on the cluster: one Ray actor, the ledger.

A running part's task reports its progress there (engine loaded, each cell's start and duration), and
the driver reads it to project when each part will end (orchestrator/execution/scheduling/dispatch.py `steal`). To move a
part's unstarted tail to an idle node, the driver asks for those cells; the part's task claims each of
them in its claims directory (adapters.contract.claims.claim_cell), where its engine worker claims every
cell before starting it, and answers with the ones it got: a cell runs on one node or the other,
never both, and only the part that ran it returns its row. A part that ends answers what is still
asked of it with nothing (`close`), so the driver never waits on a part that is gone. The actor runs
one call at a time, which is what makes an ask and a close exclusive.

The progress board (`Board`) is the other actor here: what a person sees of the run, reported by every
part (stealing or not) and drained by the driver (orchestrator/execution/progress.py).
"""

from __future__ import annotations

import tempfile
import time
from typing import Callable

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from adapters.contract.claims import claim_cell
from orchestrator.execution.scheduling.dispatch import Dispatcher, Progress, Work

POLL_S = 0.5        # how often a running part looks for cells asked of it


@ray.remote(num_cpus=0, max_restarts=0)
class Ledger:
    def __init__(self):
        self.progress: dict[str, dict] = {}
        self.asks: dict[str, list[str]] = {}
        self.answers: dict[str, list[str]] = {}
        self.closed: set[str] = set()

    # the parts' side
    def report(self, part: str, what: str, value: float) -> None:
        p = self.progress.setdefault(part, {"started": None, "load_s": None, "cell_s": [], "cell_since": None})
        if what == "begin":
            p["started"] = value
        elif what == "load":
            p["load_s"] = value
        elif what == "start":
            p["cell_since"] = value
        elif what == "done":
            p["cell_s"].append(value)
            p["cell_since"] = None

    def asked(self, part: str) -> list[str] | None:
        return self.asks.pop(part, None)

    def answer(self, part: str, cells: list[str]) -> None:
        self.answers[part] = cells

    def close(self, part: str) -> None:
        self.closed.add(part)
        self.progress.pop(part, None)
        if self.asks.pop(part, None) is not None:
            self.answers[part] = []

    # the driver's side
    def snapshot(self) -> dict[str, dict]:
        return {k: v for k, v in self.progress.items() if v["started"] is not None}

    def ask(self, part: str, cells: list[str]) -> None:
        if part in self.closed:
            self.answers[part] = []
        else:
            self.asks[part] = cells

    def answered(self) -> dict[str, list[str]]:
        out, self.answers = self.answers, {}
        return out


@ray.remote(num_cpus=0, max_restarts=0)
class Board:
    """The driver's progress board: each running part's supervisor reports here (PartReport,
    adapters/contract/events.py, fire and forget), and the driver drains it about once a second into
    what the user sees (orchestrator/execution/progress.py)."""

    def __init__(self):
        self.reports: list = []

    def report(self, r) -> None:
        self.reports.append(r)

    def drain(self) -> list:
        out, self.reports = self.reports, []
        return out


def _on_this_node() -> dict:
    """Actor options pinning it to the driver's node: it must not die with a worker node."""
    try:
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)}
    except Exception:   # a driver that is no node of the cluster (a Ray client): wherever Ray puts it
        return {}


def progress_board():
    """A progress board on the driver's node (it must not die with a worker node)."""
    return Board.options(**_on_this_node()).remote()


class Stealing:
    """The driver's side: the parts' progress into dispatcher.steal, its asks to the ledger, the answers
    into parts of their own. Should the ledger die, stealing stops, and a part that was asked for cells
    and never heard from again hands back, on finishing, what it did not row (`finished`)."""

    def __init__(self, dispatcher: Dispatcher, cell_id: Callable[[Work, int], str]):
        self.d, self.cell_id = dispatcher, cell_id
        self.ledger = Ledger.options(**_on_this_node()).remote()
        self.by_id: dict[str, Work] = {}
        self.ids: dict[Work, str] = {}
        self.asked: dict[Work, str] = {}      # victim -> the node reserved for its thief, until it answers
        self.dead = False

    def register(self, part: Work, job) -> None:
        """A part about to be submitted: its task reports to the ledger under this id."""
        job.ledger, job.part_id = (None if self.dead else self.ledger), f"p{id(part)}"
        self.by_id[job.part_id], self.ids[part] = part, job.part_id

    def poll(self) -> list[tuple[Work, Work]]:
        """(victim, thief) for every tail given up since the last poll; then new asks where a node is idle."""
        out: list[tuple[Work, Work]] = []
        if self.dead:
            return out
        try:
            for part_id, cells in (ray.get(self.ledger.answered.remote()) if self.asked else {}).items():
                victim, given = self.by_id[part_id], set(cells)
                thief = self.d.stolen(victim, tuple(i for i in victim.cells if self.cell_id(victim, i) in given),
                                      self.asked.pop(victim))
                if thief is not None:
                    out.append((victim, thief))
            if self.d.can_steal():
                now, seen = time.time(), ray.get(self.ledger.snapshot.remote())
                progress = {self.by_id[k]: Progress(v["started"], v["load_s"], v["cell_s"], v["cell_since"])
                            for k, v in seen.items() if k in self.by_id and self.by_id[k] in self.d.running}
                for victim, cells, node in self.d.steal(now, progress):
                    self.asked[victim] = node
                    self.ledger.ask.remote(self.ids[victim], [self.cell_id(victim, i) for i in cells])
            return out
        except ray.exceptions.RayError:
            self.dead = True     # no more asks; what was asked is settled by `finished`
            return out

    def lost(self, part_id: str) -> None:
        """A part's task died: whatever was asked of it and not answered, it gave up nothing."""
        if not self.dead:
            try:
                ray.get(self.ledger.close.remote(part_id))
            except ray.exceptions.RayError:
                self.dead = True

    def finished(self, part: Work, rowed: set[str]) -> Work | None:
        """With the ledger gone, a part asked for cells returns rows for all but those it gave up: they
        become a part on the node reserved for them. (With the ledger alive its answer says so.)"""
        if not self.dead or part not in self.asked:
            return None
        return self.d.stolen(part, tuple(i for i in part.cells if self.cell_id(part, i) not in rowed),
                             self.asked.pop(part))

    @property
    def waiting(self) -> bool:
        return bool(self.asked) and not self.dead


class PartChannel:
    """What a running part's task (orchestrator/execution/engine_child/supervisor.py) does with the ledger: report, and give up
    the cells asked of it that its worker has not claimed yet."""

    def __init__(self, ledger, part: str):
        self.ledger, self.part = ledger, part
        self.claims_dir = tempfile.mkdtemp(prefix="bench-claims-")
        self.withdrawn: set[str] = set()
        self.polled = 0.0
        self.report("begin", time.time())

    def report(self, what: str, value: float) -> None:
        if self.ledger is not None:
            self.ledger.report.remote(self.part, what, value)    # fire and forget: ordered per caller

    def poll(self) -> None:
        if self.ledger is None or time.monotonic() - self.polled < POLL_S:
            return
        self.polled = time.monotonic()
        try:
            asked = ray.get(self.ledger.asked.remote(self.part))
        except ray.exceptions.RayError:   # the ledger is gone: this part keeps every cell it has
            self.ledger = None
            return
        if asked is not None:
            got = [c for c in asked if claim_cell(self.claims_dir, c)]
            self.withdrawn.update(got)
            self.ledger.answer.remote(self.part, got)

    def close(self) -> None:
        if self.ledger is not None:
            try:
                ray.get(self.ledger.close.remote(self.part))
            except ray.exceptions.RayError:
                pass
