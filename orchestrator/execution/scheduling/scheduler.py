"""Engine groups -> Ray tasks. One task per group, or per part of a group the dispatcher split, asking
for the group's GPUs or CPUs on the node orchestrator/execution/scheduling/dispatch.py chose (Ray's node affinity).

The driver decides which part runs where and when, from estimates (orchestrator/execution/scheduling/estimate.py): Ray
would start any task on any node with room, with no reservations and no idea how long a task takes.
The driver is the only writer of results: tasks hand their rows back and the driver stores each
part as soon as its task finishes. A task lost with its node is submitted again (bounded); a
group no node can satisfy is reported before anything starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from typing import Callable

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from orchestrator.execution import reaper
from orchestrator.execution.stop import stop_on_sigterm
from orchestrator.execution.scheduling import model_size
from orchestrator.execution.scheduling.dispatch import Dispatcher, Work
from orchestrator.execution.scheduling.estimate import GroupFacts, History, estimate_groups
from orchestrator.execution.scheduling.ledger import Stealing, progress_board
from orchestrator.execution.progress import RunProgress
from orchestrator.execution.engine_child.rows import CellResult, cell_row
from orchestrator.execution.engine_child.spec import GroupJob
from orchestrator.execution.engine_child.supervisor import run_group
from orchestrator.matrix import placement

Rows = list[CellResult]
REFRESH_S = 30.0   # how often to look for nodes that joined the cluster
STEAL_POLL_S = 1.0  # how often to look at the running parts' progress while a node could steal
SHOW_POLL_S = 1.0   # how often to drain the progress board into what the user sees


class ClusterStartError(RuntimeError):
    """The local Ray cluster did not start, twice."""

    bench_exit_code = 3   # `bench`: the machine stopped it


RAY_LOGGERS = ("ray",)   # Ray's Python loggers in the driver; every ray.* logger propagates into "ray"


def ray_log_into(path) -> None:
    """Ray's own log lines in this driver (the "ray" logger: its token-authentication warning, its start and
    shutdown lines) into the file `path`, not the terminal: Ray gives that logger a stderr handler when
    it is imported, and ray.init only sets its level and format. The engines' own output stays in each
    worker (log_to_driver=False); a cell's reason keeps its tail."""
    import logging

    from orchestrator.store.integrity import open_nofollow

    path = os.fspath(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    os.close(open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND))   # a link there: LinkRefused, nothing written
    for name in RAY_LOGGERS:
        log = logging.getLogger(name)
        for h in list(log.handlers):   # Ray's stderr handler, and the file of an earlier run in this process
            if isinstance(h, logging.StreamHandler):
                log.removeHandler(h)
                if isinstance(h, logging.FileHandler):
                    h.close()
        handler = logging.FileHandler(path, encoding="utf-8", delay=True)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.propagate = False


def init_ray(address: str | None = None, log_file=None) -> None:
    """Start or join the cluster. With `log_file`, Ray's own log lines go there (ray_log_into), at INFO."""
    level = "WARNING"
    if log_file is not None:
        ray_log_into(log_file)
        level = "INFO"
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:   # a cluster: as it was configured (its nodes' addresses, its ports)
        with _sigterm_kept():
            ray.init(address=address, logging_level=level, log_to_driver=False)
        return
    # address="local": always a fresh local instance; without it ray.init joins any cluster another
    # process started on this machine (`ray start`, ray.cluster_utils), and then rejects num_cpus.
    # The cluster is this driver's: a watchdog kills what is left of it when the driver ends (reaper.py)
    reaper.start()
    try:
        with _sigterm_kept():
            ctx = _init_local(level)
    except Exception as first:   # Ray's startup wait (30 s, fixed in Ray) missed under load: once more
        reaper.end()   # what the failed start left running
        ray.shutdown()
        try:
            with _sigterm_kept():
                ctx = _init_local(level)
        except Exception as e:
            raise ClusterStartError(
                f"the local Ray cluster did not start, twice ({_first_line(first)}; then {_first_line(e)}). On a "
                f"loaded machine Ray's processes can miss its startup wait: run again when the load is lower, or "
                f"start a cluster yourself (`ray start --head --node-ip-address 127.0.0.1`) and give its address "
                f"with --address or RAY_ADDRESS") from e
    reaper.watch(ctx.address_info["session_dir"])


@contextlib.contextmanager
def _sigterm_kept():
    """Ray's init installs SIGTERM handlers of its own (the driver's sys.exit(15); a head node started here kills
    its processes and exits 1 with a crash dump): they are kept out, through the one function Ray installs them
    with, so a SIGTERM at any moment stops the run as Ctrl-C does (orchestrator/execution/stop.py); the reaper
    ends the local cluster."""
    utils = ray._private.utils
    install, utils.set_sigterm_handler = utils.set_sigterm_handler, lambda handler: None
    try:
        yield
    finally:
        utils.set_sigterm_handler = install
        stop_on_sigterm()   # in case a Ray without that function took it over anyway


LOOPBACK = "127.0.0.1"


def _init_local(level: str = "WARNING"):
    """A local cluster bound to the loopback interface alone: the GCS, the raylet, the workers and the agents
    listen on 127.0.0.1, so nobody who reaches this machine reaches a cluster that runs code. Ray 2.60 turns
    a node IP of 127.0.0.1 into the host's address (`resolve_ip_for_localhost`) unless it is told that this
    machine runs no multi-node cluster (what RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 says; Ray reads it when it
    is imported, so the constant is set too); given 127.0.0.1, its gRPC servers and agents bind only there.
    tests/e2e/test_run_exit.py reads the listening sockets of a run's processes."""
    from ray._private import ray_constants

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"   # what Ray's child processes read
    ray_constants.ENABLE_RAY_CLUSTER = False
    return ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, logging_level=level,
                    log_to_driver=False, _node_ip_address=LOOPBACK)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}"


def cluster_device() -> str:
    return "cuda" if ray.cluster_resources().get("GPU", 0) > 0 else "cpu"


def alive_nodes() -> dict[str, dict[str, float]]:
    return {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}


def job_need(job: GroupJob, nodes: list[dict[str, float]]) -> placement.Need:
    g, run = job.group, job.matrix.run
    # a CPU group's "whole node" is sized on the nodes that could host it at all
    routed = placement.group_need(g.framework, g.options, run, job.device, [])
    hosts = [n.get("CPU", 0) for n in nodes if placement.fits(routed, {**n, "CPU": float("inf")})]
    return placement.group_need(g.framework, g.options, run, job.device, hosts)


# max_retries=0: Ray does not re-run a group by itself; the driver decides (node loss only).
# No engine runs in the Ray worker (each group's engine is a child interpreter that exits with it), so
# CPU groups reuse Ray workers: a fresh one per group (max_calls=1) cost 0.7-2 s of the group's time on
# a 2-core host, and its replacement started while the next group's engine was being timed. GPU groups
# keep a fresh worker each (max_calls=1, Ray's own default for GPU tasks; Ray takes it only in the decorator).
def _run_on_node(job: GroupJob) -> Rows:
    node = ray.get_runtime_context().get_node_id()
    return [r._replace(row=r.row | {"node_id": node}).packed() for r in run_group(job)]


@ray.remote(max_retries=0)
def _group_task(job: GroupJob) -> Rows:
    return _run_on_node(job)


@ray.remote(max_retries=0, max_calls=1)
def _gpu_group_task(job: GroupJob) -> Rows:
    return _run_on_node(job)


def status_rows(job: GroupJob, status: str, reason: str) -> Rows:
    return [CellResult(cell_row(j, c, status, reason)) for j in (job, job.twin) if j is not None for c in j.group.cells]


def facts(job: GroupJob) -> GroupFacts:
    g, entry = job.group, job.matrix.model_entry(job.group.model)
    size, how = model_size.weight_bytes(entry.source, g.engine_quantization, entry.revision)
    return GroupFacts(g.framework, g.engine_key, tuple(c.cell_id for c in g.cells), None if how == "unknown" else size,
                      placement.engine_gpus(g.options), job.device, entry.source.endswith(".gguf"))


def part_job(job: GroupJob, part: Work) -> GroupJob:
    """The job of one part: the group with only the part's cells, in the part's order (the dispatcher puts
    the longest first); the whole job when that is all of them in their own order."""
    if part.cells == tuple(range(len(job.group.cells))):
        return job
    return dataclasses.replace(job, group=dataclasses.replace(job.group, cells=[job.group.cells[i] for i in part.cells]),
                               tries=0)


def node_names(nodes: list[dict]) -> dict[str, str]:
    """Node id -> what a person calls it: its address (with the id's start where two share one)."""
    alive = [n for n in nodes if n.get("Alive")]
    addr = [n.get("NodeManagerAddress") or n["NodeID"][:8] for n in alive]
    return {n["NodeID"]: a if addr.count(a) == 1 else f"{a} ({n['NodeID'][:8]})" for n, a in zip(alive, addr)}


def schedule(jobs: list[GroupJob], on_done: Callable[[GroupJob, Rows], None], history: History | None = None,
             progress: RunProgress | None = None) -> None:
    """Run every job on the cluster; call on_done(job, rows) in the driver as each job or part finishes.
    With `progress`, the parts report to a progress board, drained into it about once a second."""
    nodes = alive_nodes()
    runnable = []
    for job in jobs:
        reason = placement.infeasible_reason(job_need(job, list(nodes.values())), list(nodes.values()))
        if reason:
            on_done(job, status_rows(job, "unsupported", reason))
        else:
            runnable.append(job)
    if not runnable:
        return
    estimates = estimate_groups([facts(j) for j in runnable], history)
    works = [Work(j, job_need(j, list(nodes.values())), e.load_s, tuple(e.cell_s),
                  splittable=not _shared_server(j) and j.twin is None and j.timing_twin is None,   # a pair stays whole
                  load_sigma=e.load_sigma, cell_sigma=tuple(e.cell_sigma)) for j, e in zip(runnable, estimates)]
    run = runnable[0].matrix.run
    dispatcher = Dispatcher(nodes, works, split_groups=run.split_groups, steal_cells=run.steal_cells)
    parts: dict[Work, GroupJob] = {}
    pending: dict = {}
    stealing = Stealing(dispatcher, lambda part, i: part.key.group.cells[i].cell_id) if dispatcher.could_steal() else None
    board = None
    if progress is not None:
        for w in works:
            progress.planned(w.key.group.engine_key, w.load_s, {c.cell_id: s for c, s in zip(w.key.group.cells, w.cell_s)})
        progress.nodes(node_names(ray.nodes()))
        try:
            board = progress_board()
        except Exception:   # no board: the count still moves as each part's rows arrive
            board = None

    def show() -> None:
        nonlocal board
        if progress is None:
            return
        if board is not None:
            try:
                for r in ray.get(board.drain.remote(), timeout=10):
                    progress.reported(r)
            except Exception:   # the board is gone: the count moves as rows arrive, the ETA still ticks
                board = None
        progress.refresh()

    def submit(part: Work, node: str) -> None:
        job = parts.setdefault(part, part_job(part.key, part))
        job.part_id = f"p{id(part)}"
        if stealing is not None:
            stealing.register(part, job)
        if progress is not None:
            job.board = board
            progress.submitted(job.part_id, [part.key.group.cells[i] for i in part.cells], node)
        job.tries += 1
        need = part.need
        task = _gpu_group_task if need.gpus else _group_task
        affinity = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
        pending[task.options(**need.ray_options(), scheduling_strategy=affinity).remote(job)] = (job, part)

    def start_thief(victim: Work, thief: Work) -> None:
        # the victim, if sent again after a node loss, runs only the cells it kept
        tries = parts[victim].tries
        parts[victim] = part_job(victim.key, victim)
        parts[victim].tries = tries
        submit(thief, dispatcher.running[thief])

    def give_up(part: Work, why: str) -> None:
        job = parts.setdefault(part, part_job(part.key, part))
        on_done(job, status_rows(job, "failed", why))

    def report_lost() -> None:
        while dispatcher.lost:
            give_up(dispatcher.lost.pop(), "lost with its node; no node alive offers what it needs any more")

    def drive() -> None:
        looked = time.monotonic()
        while True:
            if time.monotonic() - looked > REFRESH_S:   # nodes that joined take work (their type may be new)
                dispatcher.set_nodes(alive_nodes())
                if progress is not None:
                    progress.nodes(node_names(ray.nodes()))
                report_lost()
                looked = time.monotonic()
            for part, node in dispatcher.step():
                submit(part, node)
            if stealing is not None:
                for victim, thief in stealing.poll():
                    start_thief(victim, thief)
            if not pending and not (stealing and stealing.waiting):
                # nothing runs and nothing more could start: what still waits has no node left to run on
                dispatcher.lost += [e[2] for h in dispatcher.pending.values() for e in h]
                report_lost()
                return
            looking = stealing is not None and (stealing.waiting or dispatcher.can_steal())
            wait = STEAL_POLL_S if looking else REFRESH_S
            if progress is not None:
                wait = min(wait, SHOW_POLL_S)
            if not pending:       # only answers to wait for
                time.sleep(wait)
                show()
                continue
            done, _ = ray.wait(list(pending), num_returns=1, timeout=wait)
            show()
            for ref in done:
                job, part = pending.pop(ref)
                if progress is not None:
                    progress.part_ended(job.part_id)
                try:
                    rows = [r.unpacked() for r in ray.get(ref)]
                except Exception as err:  # the task's worker or node died; run_group itself never raises
                    if stealing is not None:
                        stealing.lost(job.part_id)
                    if job.tries <= job.matrix.run.node_retries:
                        dispatcher.set_nodes(alive_nodes())   # placed again on the nodes left after the loss
                        dispatcher.requeue(part)
                        report_lost()
                        continue
                    dispatcher.finished(part)
                    rows = status_rows(job, "failed", f"lost {job.tries} times (node or worker died): "
                                                      f"{type(err).__name__}: {str(err)[-1500:]}")
                else:
                    dispatcher.finished(part)
                    thief = stealing.finished(part, {r.row["cell_id"] for r in rows}) if stealing else None
                    if thief is not None:
                        start_thief(part, thief)
                on_done(job, rows)

    try:
        drive()
    finally:   # the run's actors end with it, whether or not a handle to them is left on a job (Ray ends an actor
        # only when its last handle goes), so a driver that lives on (a test session, a notebook) keeps none
        for actor in (board, stealing.ledger if stealing is not None else None):
            if actor is not None:
                try:
                    ray.kill(actor)
                except Exception:   # already gone with its node, or Ray is shutting down
                    pass


def _shared_server(job: GroupJob) -> bool:
    """Serve cells against someone else's server: parts running at once would load the same server."""
    return job.group.mode == "serve" and bool(job.matrix.model_entry(job.group.model).endpoint)
