"""Several Ray nodes on this machine (ray.cluster_utils.Cluster): routing, infeasible groups, node loss,
a group split across nodes.

The nodes are real raylets with logical GPU counts and environment resources; the engine is the
real transformers adapter on the tiny model.
"""

import copy
import io
import re
import threading
import time

import psutil
import pytest
import ray
from ray.cluster_utils import Cluster
from rich.console import Console

from orchestrator.execution.runner import run_matrix
from orchestrator.execution.scheduling.scheduler import node_names
from orchestrator.matrix.cells import expand
from orchestrator.matrix.placement import env_resource
from orchestrator.matrix.validate import load_matrix
from orchestrator.store.run_store import RunStore
from tests.helpers import SMALL_MATRIX


@pytest.fixture
def cluster(tiny_model):
    ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})  # a CPU-less head, like a real one
    yield c
    ray.shutdown()
    c.shutdown()


def _engine_processes() -> int:
    return sum(1 for p in psutil.process_iter(["cmdline"]) if "adapters.worker" in " ".join(p.info["cmdline"] or []))


def test_groups_land_on_nodes_that_offer_what_they_ask_and_survive_node_loss(cluster, write_matrix, tmp_path):
    two_gpus = cluster.add_node(num_cpus=2, num_gpus=2, resources={env_resource("hf"): 10})
    one_gpu = cluster.add_node(num_cpus=1, num_gpus=1, resources={env_resource("hf"): 10})
    no_env = cluster.add_node(num_cpus=2, num_gpus=4)  # GPUs but no hf environment: must get nothing
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
    offers = {n["NodeID"]: n["Resources"] for n in ray.nodes()}

    data = copy.deepcopy(SMALL_MATRIX)
    data["axes"] |= {"framework": ["hf", "vllm"], "flags": ["default", "eager", "sdpa"], "batch_size": [1, 2]}
    data["flags"] = {"hf": {"eager": {"attn_implementation": "eager"}, "sdpa": {"attn_implementation": "sdpa"}}}
    data["run"] |= {"device": "cpu", "env_resources": True, "gpus_per_group": 1, "cpus_per_group": 1,
                    "node_retries": 2}

    timeline, t0 = [], time.monotonic()

    def remove_when_busy():
        # take the two-GPU node away while its groups are running engines
        while _engine_processes() < 3 and time.monotonic() - t0 < 300:
            time.sleep(0.2)
        time.sleep(2)
        timeline.append((round(time.monotonic() - t0, 1), f"removing node {two_gpus.node_id[:8]} with "
                                                         f"{_engine_processes()} engines running"))
        cluster.remove_node(two_gpus)
        timeline.append((round(time.monotonic() - t0, 1), "node removed"))

    remover = threading.Thread(target=remove_when_busy)
    remover.start()
    store = run_matrix(write_matrix(data), tmp_path / "run")
    remover.join()
    timeline.append((round(time.monotonic() - t0, 1), "run finished"))
    cells = store.read_cells()
    for r in cells.sort_values("node_id").itertuples():
        timeline.append(("", f"{r.framework}/{r.flags}/b{r.batch_size}: {r.status} on "
                             f"{r.node_id[:8] if isinstance(r.node_id, str) else '-'} (group try {r.group_tries})"))
    print("\n".join(f"{t:>6} {what}" for t, what in timeline))

    assert len(cells) == 8 and cells.cell_id.is_unique
    hf = cells[cells.framework == "hf"]
    assert set(hf.status) == {"ok"}
    for node_id in hf.node_id:
        assert offers[node_id].get(env_resource("hf"), 0) > 0 and offers[node_id].get("GPU", 0) >= 1
        assert node_id != no_env.node_id
    # the groups lost with the node ran again on the node that was left, and their rows say so
    again = hf[hf.group_tries > 1]
    assert len(again) >= 2 and set(again.node_id) == {one_gpu.node_id}
    vllm = cells[cells.framework == "vllm"]
    assert set(vllm.status) == {"unsupported"}
    assert all("no node in the cluster offers" in r and "env_vllm" in r for r in vllm.reason)


def test_a_group_that_would_bind_the_makespan_is_split_across_nodes_and_each_cell_is_stored_once(
        cluster, write_matrix, tmp_path):
    nodes = [cluster.add_node(num_cpus=1, resources={env_resource("hf"): 10}) for _ in range(2)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
    data = copy.deepcopy(SMALL_MATRIX)
    data["axes"] |= {"batch_size": [1, 2, 3]}                   # one hf engine group of three cells
    data["run"] |= {"device": "cpu", "env_resources": True, "cpus_per_group": 1}
    path = write_matrix(data)
    cells = expand(load_matrix(path)[0])
    assert len({c.engine_key for c in cells}) == 1
    # An earlier run under a results root measured each of these cells at 100 s and the engine load at
    # 1 s (`bench run --history ROOT`): 301 s in one piece, while any schedule on 2 CPUs needs only
    # max(301 / 2, 1 + 100) = 150.5 s. So the dispatcher cuts the group into parts of one cell each.
    earlier = RunStore(tmp_path / "results" / "earlier")
    for c in cells:
        earlier.write_cell({"run_id": "earlier", "cell_id": c.cell_id, "engine_key": c.engine_key, "framework": "hf",
                            "status": "ok", "load_s": 1.0, "duration_s": 100.0})

    store = run_matrix(path, tmp_path / "run", history=tmp_path / "results")
    df = store.read_cells()
    print(df[["batch_size", "status", "node_id", "load_s", "group_tries"]].to_string())
    assert len(df) == 3 and df.cell_id.is_unique and set(df.cell_id) == {c.cell_id for c in cells}
    assert set(df.status) == {"ok"} and set(df.group_tries) == {1}
    assert set(df.node_id) == {n.node_id for n in nodes}        # the parts ran on both nodes
    assert df.load_s.nunique() == 3                              # each part loaded the engine itself
    assert set(store.read_logprobs(["cell_id"]).column("cell_id").to_pylist()) == set(df.cell_id)


def test_an_idle_node_steals_the_unstarted_cells_of_a_running_group_and_each_runs_once(cluster, write_matrix, tmp_path):
    nodes = [cluster.add_node(num_cpus=1, resources={env_resource("hf"): 10}) for _ in range(2)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
    data = copy.deepcopy(SMALL_MATRIX)
    data["axes"] |= {"batch_size": [1, 2, 3, 4]}                # one hf engine group of four cells
    # no cuts before the run: the group starts whole on one node, the other node has nothing to do
    data["run"] |= {"device": "cpu", "env_resources": True, "cpus_per_group": 1, "split_groups": False,
                    "steal_cells": True}
    path = write_matrix(data)
    cells = expand(load_matrix(path)[0])
    assert len({c.engine_key for c in cells}) == 1

    # what a person at a terminal sees: the live bar, with a line per node under it
    screen = io.StringIO()
    store = run_matrix(path, tmp_path / "run", console=Console(file=screen, force_terminal=True, width=200))
    df = store.read_cells()
    print(df[["batch_size", "status", "node_id", "load_s", "group_tries"]].to_string())
    # the idle node took the group's unstarted tail while its engine loaded: each cell has one row and
    # ran on one node, each part loading the engine itself
    assert len(df) == 4 and df.cell_id.is_unique and set(df.cell_id) == {c.cell_id for c in cells}
    assert set(df.status) == {"ok"} and set(df.group_tries) == {1}
    assert set(df.node_id) == {n.node_id for n in nodes}
    assert df.load_s.nunique() >= 2     # a part that ends first may steal again from the thief
    assert set(store.read_logprobs(["cell_id"]).column("cell_id").to_pylist()) == set(df.cell_id)
    # every node had its own line under the bar, naming what ran there (loading or running the hf engine)
    names = node_names(ray.nodes())
    shown = screen.getvalue()
    assert len(names) >= 3 and all(f"  {name}: " in shown for name in names.values()), shown[-3000:]
    assert sum(bool(re.search(rf"  {re.escape(names[n.node_id])}: [^\n;]*hf", shown)) for n in nodes) == 2, shown[-3000:]
    # the run's actors (its progress board and the stealing ledger) ended with it
    from ray._private import state

    alive = [a["ActorClassName"] for a in state.actors().values() if a["State"] == "ALIVE"]
    assert not [a for a in alive if a.split(".")[-1] in ("Board", "Ledger")], alive
