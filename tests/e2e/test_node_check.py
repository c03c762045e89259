"""The preflight on a cluster (orchestrator/execution/node_check.py): model paths the driver does not have are
asked of every node, on real Ray nodes on this machine (ray.cluster_utils.Cluster). The nodes share this disk,
so a path only some nodes have is one under `~` with a home of its own per node (each raylet's HOME, which its
workers inherit): node-local disks as a cluster has them."""

import copy
import shutil

import pytest
import ray
from ray.cluster_utils import Cluster

from orchestrator.execution.node_check import apply_findings, ask_nodes
from orchestrator.execution.preflight import Preflight, resolve_model
from orchestrator.execution.runner import run_matrix
from orchestrator.matrix.models import ModelEntry
from orchestrator.store.run_store import RunStore
from tests.helpers import SMALL_MATRIX

NOWHERE = "/nonexistent/lossless-bench/model-on-no-node"


@pytest.fixture
def cluster():
    ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    yield c
    ray.shutdown()
    c.shutdown()


def test_a_path_some_nodes_lack_is_named_with_them(cluster, tiny_model, tmp_path):
    home_a, home_b = tmp_path / "home-a", tmp_path / "home-b"
    shutil.copytree(tiny_model, home_a / "models" / "tiny")
    home_b.mkdir()
    a = cluster.add_node(num_cpus=1, env_vars={"HOME": str(home_a)})
    b = cluster.add_node(num_cpus=1, env_vars={"HOME": str(home_b)})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
    found = ask_nodes(["~/models/tiny", NOWHERE])
    assert len(found.nodes) == 3 and not found.unanswered, found
    lacking = {name.split("(")[1][:8] for name in found.missing["~/models/tiny"]}
    assert lacking == {cluster.head_node.node_id[:8], b.node_id[:8]} and a.node_id[:8] not in lacking
    assert len(found.missing[NOWHERE]) == 3 and found.lack_everywhere(NOWHERE)
    assert not found.lack_everywhere("~/models/tiny")
    # what the run prints: the nodes that lack it; a path no node has is a model problem, not a line
    models = {"local": resolve_model(ModelEntry(source="~/models/tiny"), str(tmp_path)),
              "gone": resolve_model(ModelEntry(source=NOWHERE), str(tmp_path))}
    assert all(f.kind == "elsewhere" for f, _ in models.values())
    checked = Preflight()
    lines = apply_findings(checked, models, found)
    assert lines == [f"model local: ~/models/tiny is missing on 2 of 3 nodes ({', '.join(found.missing['~/models/tiny'])})"
                     ": a group placed there fails at load"]
    assert checked.model_problems == {"gone": f"model path {NOWHERE} is on neither this machine nor any of the 3 "
                                              "node(s) that answered"}


def test_a_path_no_node_has_fails_its_cells_before_any_engine(cluster, write_matrix, tmp_path):
    cluster.add_node(num_cpus=2)
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    data = copy.deepcopy(SMALL_MATRIX)
    data["models"] = {**data["models"], "gone": NOWHERE}
    data["axes"] |= {"framework": ["hf"], "model": [*data["axes"]["model"], "gone"], "batch_size": [1]}
    data["run"] |= {"device": "cpu"}
    store = run_matrix(write_matrix(data), tmp_path / "run", address=cluster.address, quiet=True)
    cells = RunStore(store.root).read_cells()
    gone = cells[cells.model == "gone"]
    assert len(gone) and set(gone.status) == {"failed"}, cells[["model", "status", "reason"]]
    assert all(r == f"preflight: model path {NOWHERE} is on neither this machine nor any of the 3 node(s) that "
               "answered" for r in gone.reason)
    assert set(cells[cells.model != "gone"].status) == {"ok"}, cells[["model", "status", "reason"]]
    assert gone.load_s.isna().all()       # no engine was started for them
