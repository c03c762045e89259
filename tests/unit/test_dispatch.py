"""The driver's dispatcher (orchestrator/execution/scheduling/dispatch.py) without Ray: which groups are cut, that every cell
runs exactly once, that parts land only where they fit and never over-commit a node, node loss, and that a
part's job runs its cells in the dispatcher's order."""

import heapq
import itertools

import pytest

from orchestrator.execution.scheduling.dispatch import Dispatcher, Progress, Work, node_type, split
from orchestrator.matrix.placement import Need

GPU1, GPU8 = Need(cpus=1, gpus=1), Need(cpus=1, gpus=8)
LLAMA = Need(cpus=1, gpus=1, custom=(("env_llamacpp", 0.001),))


def node(gpus=8, cpus=32, **custom):
    return {"CPU": cpus, "GPU": gpus, "memory": 1e11, **custom}


def run_to_end(d: Dispatcher, truth=lambda p: p.seconds):
    """Event loop: every part runs for truth(p); checks resources never go negative. -> (makespan, log)."""
    events, seq, log, now = [], itertools.count(), [], 0.0

    def start():
        for p, n in d.step():
            assert all(v >= -1e-9 for v in d.free[n].values()), (n, d.free[n])
            log.append((now, n, p))
            heapq.heappush(events, (now + truth(p), next(seq), p))

    start()
    while events:
        now, _, p = heapq.heappop(events)
        d.finished(p)
        start()
    assert d.idle()
    return now, log


def test_split_makes_the_fewest_parts_within_the_limit_and_keeps_each_cell_once():
    w = Work("g", GPU1, 10.0, (5.0, 50.0, 5.0, 30.0, 20.0, 10.0))
    parts = split(w, 70.0)
    assert len(parts) == 2
    assert sorted(c for p in parts for c in p.cells) == list(range(6))
    assert all(p.seconds <= 70.0 and list(p.cells) == sorted(p.cells) for p in parts)
    assert all(p.load_s == 10.0 for p in parts)      # each part loads the engine
    assert split(w, 1000.0) == [w]
    assert split(Work("g", GPU1, 10.0, (500.0,)), 100.0)[0].cells == (0,)    # one cell cannot be cut
    assert len(split(Work("g", GPU1, 10.0, (50.0, 50.0), splittable=False), 60.0)) == 1
    assert len(split(w, 1.0)) == 6                                            # at worst one cell per part


def test_a_group_that_would_bind_the_makespan_is_cut_and_every_cell_runs_once():
    nodes = {f"n{i}": node() for i in range(4)}     # 32 GPUs
    long = Work("long", GPU1, 20.0, tuple([10.0] * 40))              # 420 s alone
    short = [Work(f"s{i}", GPU1, 5.0, (10.0, 10.0)) for i in range(30)]
    d = Dispatcher(nodes, [long] + short)
    # T starts at the bound of the whole groups, max(work / 32 GPUs, one cell + its load) = 1170 / 32 = 36.6:
    # 40 parts of one cell; their 40 loads raise the bound to 1950 / 32 = 60.9, so T goes up by 10% a round
    # until parts of 2 cells (40 s) fit: (20 * 40 + 750) / 32 = 48.4 <= T
    parts = [p for p in d.parts if p.key == "long"]
    assert len(parts) == 20 and all(len(p.cells) == 2 for p in parts)
    assert 48.4 <= d.bound < 48.5 * 1.1
    makespan, log = run_to_end(d)
    ran = sorted((p.key, c) for _, _, p in log for c in p.cells)
    assert ran == sorted([("long", c) for c in range(40)] + [(f"s{i}", c) for i in range(30) for c in range(2)])
    assert makespan < 420 / 4                       # whole, the long group alone would take 420 s
    assert len({n for _, n, p in log if p.key == "long"}) > 1
    # without splitting it stays whole and binds the makespan
    whole = Dispatcher(nodes, [long] + short, split_groups=False)
    assert len(whole.parts) == 31 and run_to_end(whole)[0] == pytest.approx(420)


def test_parts_go_only_where_they_fit_and_constrained_ones_keep_their_node_type():
    nodes = {"big0": node(8), "big1": node(8), "l4": node(4, cpus=8, env_llamacpp=1000)}
    works = ([Work(f"w{i}", GPU8, 10.0, (30.0,) * 4) for i in range(3)]
             + [Work(f"l{i}", LLAMA, 5.0, (20.0,) * 3) for i in range(8)]
             + [Work(f"h{i}", GPU1, 5.0, (20.0,) * 3) for i in range(12)])
    d = Dispatcher(nodes, works)
    l4 = node_type(nodes["l4"])
    assert all(d.home[p] == l4 for p in d.parts if p.key.startswith("l"))
    assert not any(d.home[p] == l4 for p in d.parts if p.key.startswith("w"))   # 8 GPUs do not fit a 4-GPU node
    _, log = run_to_end(d)
    for _, n, p in log:
        assert all(nodes[n].get(k, 0) >= v for k, v in p.need.as_resources().items())
    assert {n for _, n, p in log if p.key.startswith("l")} == {"l4"}
    assert sorted(c for _, _, p in log for c in p.cells if p.key == "w0") == [0, 1, 2, 3]


def test_wide_parts_go_first_and_narrow_ones_fill_the_fullest_node():
    nodes = {"a": node(8), "b": node(8)}
    narrow = [Work(f"n{i}", GPU1, 0.0, (10.0,)) for i in range(40)]
    wide = Work("wide", GPU8, 0.0, (10.0,))
    d = Dispatcher(nodes, narrow + [wide], split_groups=False)
    first = d.step()
    assert first[0][0].key == "wide"                 # ranks before narrow parts of the same length
    one = Dispatcher(nodes, [Work("n", GPU1, 0.0, (10.0,))])
    one.free["b"]["GPU"] = 3                         # b is partly taken: the narrow part fills it further
    assert one.step()[0][1] == "b"


def test_load_heavy_and_uncertain_parts_go_before_sure_ones_of_the_same_length_and_cells_longest_first():
    def first(*works):
        return Dispatcher({"a": node(1)}, list(works), split_groups=False).step()[0][0].key

    sure, load_heavy = Work("sure", GPU1, 0.0, (20.0, 20.0)), Work("load", GPU1, 30.0, (10.0,))
    uncertain = Work("uncertain", GPU1, 0.0, (40.0,), cell_sigma=(0.6,))
    assert first(sure, load_heavy) == "load"         # its cells cannot be shared out without loading again
    assert first(sure, uncertain) == "uncertain"     # it may run long: not the last thing to start
    assert Work("w", GPU1, 0.0, (40.0,), cell_sigma=(0.6,)).spread == pytest.approx(40 * (1.433 * 0.433) ** 0.5, rel=1e-3)
    assert Work("w", GPU1, 10.0, (40.0,)).spread == 0.0
    (p, _), = Dispatcher({"a": node(1)}, [Work("g", GPU1, 1.0, (5.0, 30.0, 10.0), cell_sigma=(0.1, 0.2, 0.3))]).step()
    assert (p.cells, p.cell_s, p.cell_sigma) == ((1, 2, 0), (30.0, 10.0, 5.0), (0.2, 0.3, 0.1))   # the tail: short cells


def test_parts_lost_with_their_node_run_again_elsewhere_or_are_reported():
    nodes = {"a": node(8), "b": node(8)}
    d = Dispatcher(nodes, [Work(f"g{i}", GPU8, 1.0, (10.0,)) for i in range(2)])
    started = d.step()
    assert {n for _, n in started} == {"a", "b"}
    lost = next(p for p, n in started if n == "a")
    d.set_nodes({"b": nodes["b"]})                   # node a died
    assert d.requeue(lost) and d.step() == []        # waits for b
    d.finished(next(p for p, n in started if n == "b"))
    assert d.step() == [(lost, "b")]
    # a part only a vanished node type could run cannot be placed again: reported, not waited for
    d2 = Dispatcher({"a": node(8), "l4": node(4, env_llamacpp=1000)}, [Work("l", LLAMA, 1.0, (1.0,))])
    (p, n), = d2.step()
    d2.set_nodes({"a": node(8)})
    assert not d2.requeue(p) and d2.lost == [p]


def test_nodes_that_join_take_waiting_work():
    d = Dispatcher({"a": node(8)}, [Work(f"g{i}", GPU8, 1.0, (10.0,)) for i in range(2)], split_groups=False)
    assert len(d.step()) == 1
    d.set_nodes({"a": node(8), "new": {**node(8), "memory": 5e10}})   # another node of the same type
    assert [n for _, n in d.step()] == ["new"]


def test_an_idle_node_steals_the_unstarted_tail_of_the_part_projected_to_end_last():
    # one node of 2 GPUs; a whole group of 1 GPU (load 5 s, four cells of 10 s) and nothing else to run
    d = Dispatcher({"a": node(2)}, [Work("g", GPU1, 5.0, (10.0,) * 4)], split_groups=False)
    (victim, n), = d.step()
    assert d.step() == [] and d.can_steal()
    # at 15 s: loaded in 5, one cell took 10, the second runs since 15; cells 2 and 3 have not begun
    seen = {victim: Progress(0.0, 5.0, [10.0], 15.0)}
    (v, cells, thief_node), = d.steal(15.0, seen)
    # the victim would end at 45; a thief loads (5 s, as measured) and takes the last cell: both end at 30
    assert v is victim and cells == (3,) and thief_node == "a"
    assert d.free["a"]["GPU"] == 0 and d.steal(15.0, seen) == []    # its units are held, asked once
    thief = d.stolen(victim, cells, thief_node)
    assert thief.cells == (3,) and victim.cells == (0, 1, 2) and d.running[thief] == "a"
    d.finished(thief)
    # nothing given up (the victim had started the cell meanwhile): the node's units come back
    seen = {victim: Progress(0.0, 5.0, [10.0], 15.0)}
    victim.cell_s = (10.0, 10.0, 30.0)      # a slow config: its last cell is estimated long
    (v, cells, _), = d.steal(15.0, seen)
    assert cells == (2,)
    assert d.stolen(victim, (), "a") is None and d.free["a"]["GPU"] == 1 and victim.cells == (0, 1, 2)


def test_no_steal_while_waiting_work_could_use_the_node_or_when_it_does_not_pay_a_load():
    d = Dispatcher({"a": node(2)}, [Work("g", GPU1, 5.0, (10.0,) * 4), Work("h", GPU1, 1.0, (1.0,)),
                                    Work("i", GPU1, 1.0, (1.0,))], split_groups=False)
    started = d.step()
    assert len(started) == 2 and not d.can_steal()       # "i" waits: the node is not idle
    seen = {p: Progress(0.0) for p, _ in started}
    assert d.steal(0.0, seen) == []
    # a part whose engine takes longer to load than its cells run is not worth a second load
    d2 = Dispatcher({"a": node(2)}, [Work("g", GPU1, 100.0, (1.0,) * 4)], split_groups=False)
    (p, _), = d2.step()
    assert d2.steal(0.0, {p: Progress(0.0)}) == []
    assert not Dispatcher({"a": node(1)}, [Work("g", GPU1, 5.0, (10.0,) * 4)]).could_steal()


def test_a_part_runs_its_cells_in_the_dispatchers_order():
    """The dispatcher puts a part's longest cells first; the part's job must run them in that order."""
    from orchestrator.execution.scheduling.dispatch import Work
    from orchestrator.execution.scheduling.scheduler import part_job
    from orchestrator.execution.engine_child.spec import GroupJob
    from orchestrator.matrix.cells import EngineGroup
    from orchestrator.matrix.placement import Need

    group = EngineGroup("e", "hf", "m", "bf16", "", {}, ["c0", "c1", "c2"])
    job = GroupJob("r", group, None, "cpu", "python3", "/nonexistent")
    whole = Work(job, Need(cpus=1, gpus=0), 1.0, (5.0, 30.0, 10.0))
    assert part_job(job, whole) is job                               # all of it, in its own order
    assert part_job(job, whole.longest_first()).group.cells == ["c1", "c2", "c0"]
    assert part_job(job, whole.part([2, 0])).group.cells == ["c2", "c0"]
