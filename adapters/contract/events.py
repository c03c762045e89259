"""What a worker reports while it runs: one typed event per line of events.jsonl (`WorkerEvent`), and
the facts an adapter reports after load (`LoadFacts`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Field, TypeAdapter

from adapters.contract.host import HostFacts
from adapters.contract.specs import ContractModel


class LoadFacts(ContractModel):
    """Facts an adapter reports after load, stored with every cell of the group."""

    versions: dict[str, str] = Field(default_factory=dict)
    engine_args: dict[str, Any] = Field(default_factory=dict)
    kv_budget_bytes: int | None = None
    batch_mode: Literal["batched", "sequential"] = "batched"
    notes: list[str] = Field(default_factory=list)
    # a difference from the reference the engine makes by design, whatever the optimisation (llama.cpp's f16 GELU
    # on a CPU): the judge names it in the reason of a cell whose baseline does not share it
    engine_deviation: str | None = None
    memory_pids: list[int] = Field(default_factory=list)   # extra processes to count (engine children)


class EnvFacts(ContractModel):
    """The engine environment a group ran in (an env axis): every installed distribution and its version, the
    interpreter, and the variables its env definition set. Two of these give a pair's provenance diff."""

    name: str
    python: str                    # the interpreter's version (sys.version, first word)
    packages: dict[str, str] = Field(default_factory=dict)   # distribution name (lower case) -> version
    env_vars: dict[str, str] = Field(default_factory=dict)


class _Event(ContractModel):
    t: float = 0.0                 # wall clock (time.time) when emitted


class Started(_Event):
    event: Literal["start"] = "start"
    pid: int
    python: str


class Loaded(_Event):
    event: Literal["loaded"] = "loaded"
    load_s: float | None           # None: nothing was loaded here (someone else's server)
    load_peak_mem_bytes: int | None
    mem_source: str
    facts: LoadFacts
    model_fingerprint: str | None = None   # adapters.meters.provenance: the model files' content hash
    host: HostFacts | None = None  # the node's CPU, memory, GPUs, NVIDIA driver
    missing: dict[str, str] = Field(default_factory=dict)   # load-level figure -> why it is null
    env: EnvFacts | None = None    # an env axis: the environment it loaded in


class TurnWait(_Event):
    """An env pair (GroupSpec.turns): the worker waits for the floor before a phase of engine work, until its
    supervisor writes a line to its stdin; `timed` phases are granted in the pair's ABBA order."""

    event: Literal["turn_wait"] = "turn_wait"
    cell_id: str | None            # None: the load
    phase: Literal["load", "warmup", "timed", "after"]   # after: the logprobs, samples and tasks of the cell
    repeat: int | None = None      # timed: which repeat


class TurnDone(_Event):
    """The phase a TurnWait asked for has ended: the floor is free."""

    event: Literal["turn_done"] = "turn_done"


class GroupUnsupported(_Event):
    event: Literal["unsupported"] = "unsupported"
    cells: list[str]
    reason: str


class LoadFailed(_Event):
    event: Literal["load_failed"] = "load_failed"
    cells: list[str]
    reason: str
    traceback: str | None = None


class CellStart(_Event):
    event: Literal["cell_start"] = "cell_start"
    cell_id: str


class CellDone(_Event):
    event: Literal["cell_done"] = "cell_done"
    cell_id: str                   # its CellRecord is <cell_id>.json, its logprob rows <cell_id>.npz


class CellFailed(_Event):
    event: Literal["cell_failed"] = "cell_failed"
    cell_id: str
    reason: str
    traceback: str | None = None


class CellUnsupported(_Event):
    event: Literal["cell_unsupported"] = "cell_unsupported"
    cell_id: str
    reason: str


class End(_Event):
    event: Literal["end"] = "end"


WorkerEvent = Annotated[Union[Started, Loaded, GroupUnsupported, LoadFailed, CellStart, CellDone, CellFailed,
                              CellUnsupported, End, TurnWait, TurnDone], Field(discriminator="event")]


_EVENT = TypeAdapter(WorkerEvent)


def parse_event(line: str | bytes) -> WorkerEvent:
    return _EVENT.validate_json(line)


class PartReport(ContractModel):
    """What a running engine group (or part of one) tells the driver while it runs, across Ray: its
    supervisor (orchestrator/execution/engine_child/supervisor.py) sends one to the driver's progress board
    (orchestrator/execution/progress.py) as its engine starts loading, has loaded, starts a cell, and as
    each cell gets its row (`status`: the row's, ok, failed, timeout, crashed, unsupported)."""

    part: str                      # the part's id (GroupJob.part_id)
    what: Literal["loading", "loaded", "start", "end"]
    cell_id: str | None = None     # start, end: the cell
    status: str | None = None      # end: the status of the cell's row
    t: float = 0.0                 # wall clock (time.time) on the part's node
