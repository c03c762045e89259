"""The launcher's Arrow conversion of a cell's outputs (orchestrator/execution/engine_child/rows.py): the logprob
table has the store's schema and every value the engine child wrote. (That it imports nothing heavy,
in a fresh interpreter and in a Ray worker: e2e/test_harness_costs.py.)"""

import pyarrow as pa

from orchestrator.execution.engine_child.rows import read_logprob_rows
from orchestrator.store.schema import LOGPROBS_SCHEMA
from tests.helpers import logprob_npz


def test_logprob_table_has_the_schema_and_every_value(tmp_path):
    data = logprob_npz(tmp_path / "c.npz")
    table = read_logprob_rows("run-1", "cell-1", tmp_path / "c.npz")
    table.validate(full=True)
    assert table.schema.equals(LOGPROBS_SCHEMA)
    for name in ("repeat", "prompt_index", "position", "token_id", "logprob", "topk_ids", "topk_logprobs"):
        assert table[name].to_pylist() == data[name].tolist(), name
    assert table["kind"].to_pylist() == ["prompt" if x == 0 else "generation" for x in data["kind"]]
    assert set(table["run_id"].to_pylist()) == {"run-1"} and set(table["cell_id"].to_pylist()) == {"cell-1"}
    # what pyarrow itself builds from the same arrays
    ref = pa.table({"topk_ids": pa.FixedSizeListArray.from_arrays(pa.array(data["topk_ids"].reshape(-1)), 4)
                    .cast(pa.list_(pa.int32()))})
    assert table["topk_ids"].equals(ref["topk_ids"])
