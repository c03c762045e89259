"""Several Ray nodes on this machine (ray.cluster_utils.Cluster): routing, infeasible groups, node loss.

The nodes are real raylets with logical GPU counts and environment resources; the engine is the
real transformers adapter on the tiny model.
"""

import copy
import threading
import time

import psutil
import pytest
import ray
from ray.cluster_utils import Cluster

from conftest import SMALL_MATRIX
from orchestrator.placement import env_resource
from orchestrator.runner import run_matrix


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
