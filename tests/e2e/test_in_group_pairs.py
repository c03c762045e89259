"""A baseline in the cell's own engine load, timed in turns inside it: hf on the built-in tiny model at batch 1
and 4, the baseline selector fixing batch_size 1, on real Ray. The batch-4 cell's row carries batch 1's batch timed
again beside each of its repeats (ABBA, never overlapping, one engine load: no twin), and the judge's interval for
it is the paired t over those pairs; batch 1's own row (the baseline) is not paired. The batch-4 cell's peak memory
is its own batches' (taken around its own repeats)."""

from __future__ import annotations

import yaml

from tests.helpers import abba, turn_order

REPEATS = 4


def test_batch_4_against_batch_1_takes_turns_in_one_engine(ray_local, tiny_model, tmp_path):
    from orchestrator.execution.runner import run_matrix
    from orchestrator.judge.analysis import analyse

    matrix = {
        "name": "in-group-pairs",
        "models": {"tiny": "builtin:tiny"},
        "axes": {"framework": ["hf"], "model": ["tiny"], "quantization": ["fp32"], "batch_size": [1, 4],
                 "input_len": [16], "output_len": [8]},
        "measure": {"warmup": 1, "repeats": REPEATS, "scoring_prompts": 1, "scoring_len": 16, "greedy_tokens": 2,
                    "score_repeats": 1, "top_k": 2},
        "baseline": {"framework": "hf", "quantization": "fp32", "flags": "default", "batch_size": 1},
        "run": {"cell_timeout_s": 300, "load_timeout_s": 300},
    }
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(matrix))
    cells = run_matrix(tmp_path / "m.yaml", tmp_path / "run", quiet=True).read_cells().set_index("batch_size")
    assert (cells.status == "ok").all(), cells.reason.tolist()
    b4, b1 = cells.loc[4], cells.loc[1]
    assert b4["base_timing_cell"] == b1["cell_id"]
    base_runs = list(b4["base_output_tok_s_runs"])
    assert len(base_runs) == REPEATS and all(x > 0 for x in base_runs)
    assert list(b1["output_tok_s_runs"]) != base_runs   # measurements of their own
    assert len(b4["base_host_busy_runs"]) == REPEATS
    assert turn_order(b4) == abba(REPEATS)
    assert "base_output_tok_s_runs" not in b4["missing"]
    assert not isinstance(b1["base_timing_cell"], str) and "base_output_tok_s_runs" in b1["missing"]
    assert b4["peak_mem_bytes"] > 0

    df = analyse(tmp_path / "run").set_index("batch_size")
    assert df.loc[4, "baseline_cell_id"] == b1["cell_id"]
    assert df.loc[4, "speed_test"] == "paired t"
    assert df.loc[4, "speedup_n_cell"] == df.loc[4, "speedup_n_base"] == REPEATS
    assert df.loc[4, "speedup_lo"] < df.loc[4, "speedup"] < df.loc[4, "speedup_hi"]
