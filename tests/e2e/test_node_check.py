"""The preflight on a cluster (orchestrator/execution/preflight.py): model paths the driver does not have are
asked of every node, on real Ray nodes on this machine (ray.cluster_utils.Cluster: the head and one more; a
raylet that does not register within Ray's fixed 30 s fails a test, and each one more made that likelier).
The nodes share this disk, so which node lacks a path cannot differ here: the nodes' own answers are checked
for paths every node has and none has, and the case of a path some nodes lack is given those nodes' real names.
(A node with a HOME of its own, so that `~/models` differed per node, did not register within the 30 s after
the engine tests ran in the same session.)"""

import copy

import pytest
import ray
from ray.cluster_utils import Cluster

from orchestrator.execution.preflight import NodeFindings, apply_findings, ask_nodes
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
    a = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
    found = ask_nodes([str(tiny_model), NOWHERE])
    assert len(found.nodes) == 2 and not found.unanswered, found
    assert {n.split("(")[1][:8] for n in found.nodes} == {cluster.head_node.node_id[:8], a.node_id[:8]}
    assert str(tiny_model) not in found.missing and not found.lack_everywhere(str(tiny_model))
    assert len(found.missing[NOWHERE]) == 2 and found.lack_everywhere(NOWHERE)
    # what the run prints where one of these nodes lacks a path: the node named; a path no node has is a
    # model problem, its cells failed (the next test runs that through bench run)
    head = next(n for n in found.nodes if cluster.head_node.node_id[:8] in n)
    partial = NodeFindings(found.nodes, {"~/models/tiny": [head], NOWHERE: found.missing[NOWHERE]}, [])
    models = {"local": resolve_model(ModelEntry(source="~/models/tiny"), str(tmp_path)),
              "gone": resolve_model(ModelEntry(source=NOWHERE), str(tmp_path))}
    assert all(f.kind == "elsewhere" for f, _ in models.values())
    checked = Preflight()
    assert apply_findings(checked, models, partial) == [
        f"model local: ~/models/tiny is missing on 1 of 2 nodes ({head}): a group placed there fails at load"]
    assert checked.model_problems == {"gone": f"model path {NOWHERE} is on neither this machine nor any of the 2 "
                                              "node(s) that answered"}


def test_a_path_no_node_has_fails_its_cells_before_any_engine(cluster, write_matrix, tmp_path):
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    data = copy.deepcopy(SMALL_MATRIX)
    data["models"] = {**data["models"], "gone": NOWHERE}
    data["axes"] |= {"framework": ["hf"], "model": [*data["axes"]["model"], "gone"], "batch_size": [1]}
    data["run"] |= {"device": "cpu"}
    store = run_matrix(write_matrix(data), tmp_path / "run", address=cluster.address, quiet=True)
    cells = RunStore(store.root).read_cells()
    gone = cells[cells.model == "gone"]
    assert len(gone) and set(gone.status) == {"failed"}, cells[["model", "status", "reason"]]
    assert all(r == f"preflight: model path {NOWHERE} is on neither this machine nor any of the 2 node(s) that "
               "answered" for r in gone.reason)
    assert set(cells[cells.model != "gone"].status) == {"ok"}, cells[["model", "status", "reason"]]
    assert gone.load_s.isna().all()       # no engine was started for them
