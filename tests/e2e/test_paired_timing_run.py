"""measure.paired_timing on a real engine pair and real Ray: a matrix of two groups (llama.cpp beside the hf
baseline, the built-in tiny model, batch 1) loads the hf baseline's engine beside the llama.cpp group as a timing
twin; the llama.cpp cell's row carries the baseline's repeats taken in turns with its own (ABBA: the wall-clock
times never overlap), and the judge's interval for it is the paired t over n pairs. With paired_timing false the
same matrix runs as before: no base_* repeats, Welch against the baseline's own row."""

from __future__ import annotations

import pytest
import yaml

from tests.helpers import abba, turn_order

REPEATS = 4


def _run(tmp_path_factory, paired: bool):
    from orchestrator.execution.runner import run_matrix
    from orchestrator.judge.analysis import analyse

    d = tmp_path_factory.mktemp(f"paired-{paired}")
    matrix = {
        "name": "paired-timing-test",
        "models": {"tiny": "builtin:tiny"},
        "axes": {"framework": ["hf", "llamacpp"], "model": ["tiny"], "quantization": ["fp32"], "batch_size": [1],
                 "input_len": [16], "output_len": [8]},
        "measure": {"warmup": 1, "repeats": REPEATS, "scoring_prompts": 1, "scoring_len": 16, "greedy_tokens": 2,
                    "score_repeats": 1, "top_k": 2, "paired_timing": paired},
        "baseline": {"framework": "hf", "quantization": "fp32", "flags": "default"},
        "run": {"cell_timeout_s": 300, "load_timeout_s": 300},
    }
    (d / "m.yaml").write_text(yaml.safe_dump(matrix))
    store = run_matrix(d / "m.yaml", d / "run", quiet=True)
    return store.read_cells().set_index("framework"), analyse(d / "run").set_index("framework")


@pytest.fixture(scope="module")
def paired_run(ray_local, tiny_model, tmp_path_factory):
    return _run(tmp_path_factory, True)


def test_the_cells_row_carries_the_baselines_repeats_taken_in_turns(paired_run):
    cells, _ = paired_run
    for fw in ("hf", "llamacpp"):
        assert cells.loc[fw, "status"] == "ok", cells.loc[fw, "reason"]
    cpp, hf = cells.loc["llamacpp"], cells.loc["hf"]
    assert cpp["base_timing_cell"] == hf["cell_id"]
    base_runs = list(cpp["base_output_tok_s_runs"])
    assert len(base_runs) == REPEATS and all(x > 0 for x in base_runs)
    assert len(cpp["base_host_busy_runs"]) == REPEATS
    # the twin's repeats are measurements of their own, not the baseline row's
    assert list(hf["output_tok_s_runs"]) != base_runs
    assert not isinstance(hf["base_timing_cell"], str)   # the baseline's own row: nothing paired
    assert turn_order(cpp) == abba(REPEATS)


def test_the_judge_says_paired_t(paired_run):
    _, df = paired_run
    cpp = df.loc["llamacpp"]
    assert cpp["speed_test"] == "paired t"
    assert cpp["speedup_n_cell"] == cpp["speedup_n_base"] == REPEATS
    assert cpp["speedup_lo"] < cpp["speedup"] < cpp["speedup_hi"]   # the pairs' geometric mean ratio


def test_paired_timing_off_is_welch_as_before(ray_local, tiny_model, tmp_path_factory):
    cells, df = _run(tmp_path_factory, False)
    assert (cells.status == "ok").all(), cells.reason.tolist()
    cpp = cells.loc["llamacpp"]
    assert not isinstance(cpp["base_timing_cell"], str)
    assert df.loc["llamacpp", "speed_test"] == "Welch t"
