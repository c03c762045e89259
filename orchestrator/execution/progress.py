"""What a person sees while `bench run` runs: cells done of the total, moving as each cell ends, the cell
(and engine) running on each node, and an ETA from the scheduler's own estimates.

Pure (no Ray): the scheduler (orchestrator/execution/scheduling/scheduler.py) tells `RunProgress` what it planned
(each group's estimated load and cells, orchestrator/execution/scheduling/estimate.py) and where it sent each part,
and hands it the `PartReport`s (adapters/contract/events.py) the parts' supervisors send to the driver's
progress board (orchestrator/execution/scheduling/ledger.py, `Board`) as engines load and cells start and end. The
runner hands it each stored row, so a cell that never ran (no node could host it, lost with its node)
counts as done too.

Three ways to show it (`RunProgress.mode`):
  live   a terminal: a rich bar (cells done / total, ok and not ok, elapsed, ETA) and, under it, what runs:
         one line per running part, or one line per node when the cluster has more than one;
  plain  not a terminal (a pipe, a CI log): one line per finished cell, nothing redrawn;
  quiet  `bench run --quiet`: nothing.

The ETA: every unfinished cell's estimate and every engine group's load not yet begun, each scaled by
what this run has measured so far (measured / estimated over the cells, and the loads, that ended: of
the same framework where it has some, else of every framework, as estimate.py calibrates priors; 1
before any), less what the running cells and loads have already spent, over the parts running at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from adapters.contract.events import PartReport
from orchestrator.matrix.cells import Cell

OK = "ok"


def cell_label(c: Cell) -> str:
    """A cell as a person names it: framework/model/quantization/flags b=batch, and what else sets it apart."""
    out = f"{c.framework}/{c.model}/{c.quantization}/{c.flags} b={c.batch_size}"
    if c.mode != "offline":
        out += f" {c.mode}"
    if c.request_rate is not None and c.request_rate != float("inf"):
        out += f" {c.request_rate:g} req/s"
    if c.search:
        out += " search"
    if c.workload:
        out += f" {c.workload}"
    return out


def engine_label(c: Cell) -> str:
    return f"{c.framework}/{c.model}/{c.quantization}/{c.flags}"


def clock(seconds: float | None) -> str:
    if seconds is None:
        return "-:--:--"
    s = max(int(round(seconds)), 0)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


@dataclass
class _Part:
    cells: list[Cell]
    node: str
    group: str                       # its engine group (engine_key): the group's load counts once
    loading_since: float | None = None   # report clock (the part's node)
    loaded: bool = False
    cell: str | None = None          # the cell running now
    cell_since: float | None = None
    seen_at: float = 0.0             # the driver's clock when the last report arrived
    node_lag: float = 0.0            # driver clock - node clock, at that report


@dataclass
class RunProgress:
    console: Console
    name: str
    cells: list[Cell]                # the planned cells of this run (not an SLO search's probes)
    mode: str = "live"               # live | plain | quiet
    now: callable = time.time
    est_cell: dict[str, float] = field(default_factory=dict)    # cell_id -> estimated seconds
    est_load: dict[str, float] = field(default_factory=dict)    # engine_key -> estimated load seconds
    node_names: dict[str, str] = field(default_factory=dict)    # node id -> what to call it
    parts: dict[str, _Part] = field(default_factory=dict)
    status: dict[str, str] = field(default_factory=dict)        # cell_id -> status, once it ended
    began: set = field(default_factory=set)                     # engine groups with a part submitted
    # per framework, and over all ("*"): estimated, measured load s; estimated, measured cell s (what ended)
    measured: dict = field(default_factory=dict)
    started: float = 0.0

    def __post_init__(self):
        self.by_id = {c.cell_id: c for c in self.cells}
        self.started = self.now()
        self._bar = None
        # what is left, kept as cells end (not summed again per refresh: a run may have 100k cells):
        # per framework, the estimated seconds of the cells not ended and of the loads not begun
        self._cells_left: dict[str, float] = {}
        self._loads_left: dict[str, float] = {}
        self._counted: set[str] = set()            # cells whose estimate is in _cells_left
        self._load_counted: set[str] = set()       # engine groups whose load is in _loads_left
        self._group_left: dict[str, int] = {}      # engine group -> its cells not ended
        self._group_fw: dict[str, str] = {}
        self._ok = 0
        for c in self.cells:
            self._group_left[c.engine_key] = self._group_left.get(c.engine_key, 0) + 1
            self._group_fw[c.engine_key] = c.framework

    @classmethod
    def for_console(cls, console: Console, name: str, cells: list[Cell], quiet: bool = False) -> "RunProgress":
        """live on a terminal, plain lines elsewhere, quiet when asked."""
        mode = "quiet" if quiet else ("live" if console.is_terminal and not console.is_dumb_terminal else "plain")
        return cls(console, name, cells, mode)

    # -- what the scheduler says ----------------------------------------------------------------------

    def planned(self, engine_key: str, load_s: float, cell_s: dict[str, float]) -> None:
        self.est_load[engine_key] = load_s
        self.est_cell.update(cell_s)
        for cid, sec in cell_s.items():
            if cid in self.by_id and cid not in self.status and cid not in self._counted:
                self._counted.add(cid)
                fw = self.by_id[cid].framework
                self._cells_left[fw] = self._cells_left.get(fw, 0.0) + sec
        if (engine_key not in self.began and engine_key not in self._load_counted
                and self._group_left.get(engine_key, 0) > 0):
            self._load_counted.add(engine_key)
            fw = self._group_fw.get(engine_key, "?")
            self._loads_left[fw] = self._loads_left.get(fw, 0.0) + load_s

    def _load_begun(self, engine_key: str) -> None:
        if engine_key in self._load_counted:
            self._load_counted.discard(engine_key)
            fw = self._group_fw.get(engine_key, "?")
            self._loads_left[fw] = max(self._loads_left.get(fw, 0.0) - self.est_load.get(engine_key, 0.0), 0.0)

    def nodes(self, names: dict[str, str]) -> None:
        self.node_names = dict(names)

    def submitted(self, part_id: str, cells: list[Cell], node: str) -> None:
        key = cells[0].engine_key if cells else part_id
        self.parts[part_id] = _Part(list(cells), node, key)
        self.began.add(key)
        self._load_begun(key)
        self.refresh()

    def part_ended(self, part_id: str) -> None:
        if self.parts.pop(part_id, None) is not None:   # (its late reports, if any, are dropped)
            self.refresh()

    def reported(self, r: PartReport) -> None:
        p = self.parts.get(r.part)
        if p is None:
            return
        p.seen_at, p.node_lag = self.now(), self.now() - r.t
        if r.what == "loading":
            p.loading_since, p.loaded, p.cell, p.cell_since = r.t, False, None, None
        elif r.what == "loaded":
            if p.loading_since is not None and p.group in self.est_load:
                self._measured(p.cells[0].framework if p.cells else "?", 0, self.est_load[p.group],
                               max(r.t - p.loading_since, 0.0))
            p.loaded = True
        elif r.what == "start":
            p.loaded, p.cell, p.cell_since = True, r.cell_id, r.t
        elif r.what == "end" and r.cell_id:
            if p.cell == r.cell_id and p.cell_since is not None and r.cell_id in self.est_cell:
                self._measured(self.by_id[r.cell_id].framework if r.cell_id in self.by_id else "?", 2,
                               self.est_cell[r.cell_id], max(r.t - p.cell_since, 0.0))
            if p.cell == r.cell_id:
                p.cell, p.cell_since = None, None
            self._ended(r.cell_id, r.status or "?")
        self.refresh()

    def _measured(self, framework: str, at: int, estimated: float, seen: float) -> None:
        for key in (framework, "*"):
            m = self.measured.setdefault(key, [0.0, 0.0, 0.0, 0.0])
            m[at] += estimated
            m[at + 1] += seen

    def scale(self, framework: str) -> tuple[float, float]:
        """(load, cell) factors on a framework's estimates: measured / estimated, its own where it has
        measured some, else the run's; a load with nothing measured takes the cells' factor."""
        def k(at: int) -> float | None:
            for key in (framework, "*"):
                m = self.measured.get(key)
                if m and m[at] > 0:
                    return m[at + 1] / m[at]
            return None
        cell = k(2)
        cell = 1.0 if cell is None else cell
        load = k(0)
        return (cell if load is None else load), cell

    def stored(self, cell_id: str, status: str) -> None:
        """A row the driver stored: the cell ended, whatever its part reported (or did not)."""
        if cell_id not in self.by_id:
            return       # an SLO search's probe: a row, not a planned cell
        if cell_id in self.status:
            self._ok += (status == OK) - (self.status[cell_id] == OK)
            self.status[cell_id] = status     # the row's word is the last
        else:
            self._ended(cell_id, status)
        self.refresh()

    def _ended(self, cell_id: str, status: str) -> None:
        if cell_id in self.status or cell_id not in self.by_id:
            return
        self.status[cell_id] = status
        self._ok += status == OK
        c = self.by_id[cell_id]
        if cell_id in self._counted:
            self._counted.discard(cell_id)
            self._cells_left[c.framework] = max(self._cells_left.get(c.framework, 0.0) - self.est_cell.get(cell_id, 0.0), 0.0)
        self._group_left[c.engine_key] -= 1
        if self._group_left[c.engine_key] == 0:
            self._load_begun(c.engine_key)      # all its cells ended without a part begun (no node could host it)
        if self.mode == "plain":
            eta = self.eta()
            f = self.console.file    # as it is: no markup, no wrapping, no colour (a log, a pipe)
            f.write(f"[{self.done}/{len(self.cells)}] {status:<11} {cell_label(self.by_id[cell_id])}"
                    f"  elapsed {clock(self.now() - self.started)}  ETA {clock(eta)}\n")
            f.flush()

    # -- what it makes of it --------------------------------------------------------------------------

    @property
    def done(self) -> int:
        return len(self.status)

    @property
    def ok(self) -> int:
        return self._ok

    def running(self) -> list[tuple[str, _Part]]:
        return list(self.parts.items())   # a copy: the display's thread reads it too

    def eta(self) -> float | None:
        """Seconds until the run ends, from the estimates scaled by what this run measured; None: no estimate."""
        if self.done == len(self.cells):
            return 0.0
        if not self.est_cell:
            return None
        now = self.now()
        scale = {fw: self.scale(fw) for fw in {*self._cells_left, *self._loads_left}}
        work = sum(sec * scale[fw][1] for fw, sec in self._cells_left.items())
        work += sum(sec * scale[fw][0] for fw, sec in self._loads_left.items())
        running = self.running()
        for _, p in running:
            on_node = now - p.node_lag       # the part's clock now
            k_load, k_cell = self.scale(p.cells[0].framework if p.cells else "?")
            if p.cell and p.cell_since is not None:
                work -= min(on_node - p.cell_since, self.est_cell.get(p.cell, 0.0) * k_cell)
            elif not p.loaded:
                load = self.est_load.get(p.group, 0.0) * k_load
                spent = on_node - p.loading_since if p.loading_since is not None else 0.0
                work += max(load - spent, 0.0)
        return max(work, 0.0) / max(len(running), 1)

    def doing(self, p: _Part) -> str:
        """What a part does now: running a cell (for how long), loading its engine, or about to."""
        now = self.now()
        if p.cell and p.cell in self.by_id:
            since = now - p.node_lag - p.cell_since if p.cell_since is not None else None
            return f"running {cell_label(self.by_id[p.cell])}  ({clock(since)})"
        what = engine_label(p.cells[0]) if p.cells else "?"
        if p.loading_since is not None and not p.loaded:
            return f"loading {what}  ({clock(now - p.node_lag - p.loading_since)})"
        return f"starting {what}" if not p.loaded else f"{what}: between cells"

    def lines(self) -> list[str]:
        """What runs, under the bar: one line per running part; per node where there is more than one node."""
        running = self.running()
        if len(self.node_names) > 1:
            out = []
            for node, name in sorted(self.node_names.items(), key=lambda kv: kv[1]):
                here = [self.doing(p) for _, p in running if p.node == node]
                out.append(f"  {name}: " + ("; ".join(here) if here else "idle"))
            return out
        return [f"  {self.doing(p)}" for _, p in running]

    # -- the live display -----------------------------------------------------------------------------

    def __enter__(self) -> "RunProgress":
        if self.mode == "live":
            columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                       TextColumn("cells  ok {task.fields[ok]}  not ok {task.fields[bad]}"), TimeElapsedColumn(),
                       TextColumn("ETA {task.fields[eta]}"))
            # redrawn once a second (rich's default is 10): the driver shares the CPUs with the engines it times
            self._bar = _Bar(self.lines, *columns, console=self.console, transient=False, refresh_per_second=1)
            self._task = self._bar.add_task(self.name, total=len(self.cells), ok=0, bad=0, eta=clock(None))
            self._bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self.parts.clear()
            self.refresh()
            self._bar.__exit__(*exc)
            self._bar = None

    def refresh(self) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, ok=self.ok, bad=self.done - self.ok,
                             eta=clock(self.eta()))


class _Bar(Progress):
    """rich's Progress with what runs under it."""

    def __init__(self, lines, *columns, **kwargs):
        self._lines = lines
        super().__init__(*columns, **kwargs)

    def get_renderables(self) -> Iterable:
        yield self.make_tasks_table(self.tasks)
        for line in self._lines():
            yield Text(line, overflow="ellipsis", no_wrap=True)
