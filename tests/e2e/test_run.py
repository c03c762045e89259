"""`bench run` end to end on a real local Ray cluster, the real transformers engine and real Parquet.
(The transformers adapter on its own, in process: engines/test_hf.py.)"""

import copy
import json
import os

import duckdb
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from orchestrator.execution.runner import run_matrix
from orchestrator.matrix.models import MatrixError
from orchestrator.store.schema import CELLS_FILE_SCHEMA, LOGPROBS_SCHEMA, STATUSES
from tests.helpers import SMALL_MATRIX

M = SMALL_MATRIX["measure"]


@pytest.fixture(scope="module")
def small_run(ray_local, tmp_path_factory, tiny_model):
    import yaml

    d = tmp_path_factory.mktemp("small")
    path = d / "small.yaml"
    data = copy.deepcopy(SMALL_MATRIX)
    data["axes"]["quantization"] = ["fp32", "q4_0"]  # hf cannot run q4_0: an `unsupported` row
    path.write_text(yaml.safe_dump(data))
    store = run_matrix(path, d / "run")
    return store, path


def test_one_row_per_cell_with_sane_numbers(small_run):
    store, _ = small_run
    cells = store.read_cells()
    assert len(cells) == 4 and cells["cell_id"].is_unique
    ok = cells[cells.status == "ok"]
    assert sorted(ok.batch_size) == [1, 2]
    for r in ok.itertuples():
        assert r.requests == M["repeats"] * r.batch_size
        assert 0 < r.ttft_ms_p50 < r.e2e_ms_p50
        assert r.ttft_ms_p50 <= r.ttft_ms_p99
        assert r.tpot_ms_p50 > 0 and r.output_tok_s > 0 and r.total_tok_s > r.output_tok_s
        assert len(r.output_tok_s_runs) == M["repeats"]
        # how disturbed each repeat was: one share of the engine cores per repeat; no GPU here, so null with why
        assert len(r.host_busy_runs) == M["repeats"] and all(0 <= x <= 1 for x in r.host_busy_runs)
        assert r.gpu_busy_runs is None and json.loads(r.missing)["gpu_busy_runs"]
        assert r.load_s > 0 and r.peak_mem_bytes > 50 * 2**20 and r.mem_source == "rss-peak-tree"
        assert json.loads(r.versions)["torch"].startswith("2.13.0")
        assert r.batch_mode == "batched"
    bad = cells[cells.quantization == "q4_0"]
    assert set(bad.status) == {"unsupported"}
    assert all("hf does not run quantization q4_0" in r for r in bad.reason)


def test_logprob_rows_per_cell(small_run):
    store, _ = small_run
    lp = pd.read_parquet(store.root / "logprobs")
    ok = store.read_cells().query("status == 'ok'")
    assert set(lp.cell_id) == set(ok.cell_id)
    for cid in ok.cell_id:
        rows = lp[lp.cell_id == cid]
        n_prompt = M["scoring_prompts"] * (M["scoring_len"] - 1) * M["score_repeats"]
        n_gen = M["scoring_prompts"] * M["greedy_tokens"] * M["score_repeats"]
        assert (rows.kind == "prompt").sum() == n_prompt
        assert (rows.kind == "generation").sum() == n_gen
        assert not rows.duplicated(["kind", "repeat", "prompt_index", "position"]).any()
    assert (lp.logprob <= 0).all()
    top = np.stack(lp.topk_logprobs.to_numpy())
    assert top.shape[1] == M["top_k"] and (np.diff(top, axis=1) <= 0).all()
    # greedy picks the top-1 candidate, and its logprob is the one stored for the token
    gen = lp[lp.kind == "generation"]
    assert (gen.token_id.to_numpy() == np.array([t[0] for t in gen.topk_ids])).all()
    assert np.allclose(gen.logprob.to_numpy(), [t[0] for t in gen.topk_logprobs])
    # teacher-forced rows score the prompt's own next tokens: the same ids in every cell
    prompt = lp[(lp.kind == "prompt") & (lp.repeat == 0)]
    per_cell = prompt.groupby("cell_id").token_id.apply(list)
    assert len(set(map(tuple, per_cell))) == 1


def test_fixed_schemas_and_readers(small_run):
    store, _ = small_run
    for f in (store.root / "cells").rglob("*.parquet"):
        assert pq.read_schema(f).remove_metadata().equals(CELLS_FILE_SCHEMA)
    for f in (store.root / "logprobs").rglob("*.parquet"):
        assert pq.read_schema(f).remove_metadata().equals(LOGPROBS_SCHEMA)
    assert set(pd.read_parquet(store.root / "cells").status) <= set(STATUSES)
    n = duckdb.sql(f"select count(*) from read_parquet('{store.root}/cells/**/*.parquet', hive_partitioning=true) "
                   "where framework = 'hf'").fetchall()[0][0]
    assert n == 4


def test_manifest_records_what_ran_and_where_without_paths(small_run):
    store, path = small_run
    manifest = store.read_manifest()
    assert manifest.matrix_text == path.read_text() and manifest.matrix.name == "small"   # a real Matrix
    assert len(manifest.cells) == 4
    assert manifest.host["cpu_count"] >= 1 and "ray" in manifest.driver_versions
    text = (store.root / "manifest.json").read_text()
    for f in (store.root / "cells").rglob("*.parquet"):
        text += pd.read_parquet(f).to_json()
    assert os.path.expanduser("~") not in text and str(store.root) not in text


def test_rerun_skips_stored_cells_and_rerun_failed_retries_the_rest(small_run):
    store, path = small_run
    files = sorted((store.root / "cells").rglob("*.parquet"))
    before = {f: f.stat().st_mtime_ns for f in files}
    run_matrix(path, store.root)
    assert {f: f.stat().st_mtime_ns for f in files} == before
    # the run ended compacted: one cells and one logprobs file for the framework, nothing per cell
    assert [f.name for f in files] == ["compacted-1.parquet"]
    first = store.read_cells().set_index("cell_id").started_at
    run_matrix(path, store.root, rerun_failed=True)
    cells = store.read_cells()
    again = set(cells[cells.started_at != cells.cell_id.map(first)].cell_id)
    assert again == set(cells[cells.status != "ok"].cell_id) and again  # only the cells not ok ran again
    assert len(cells) == 4 and cells.cell_id.is_unique
    raw = pd.read_parquet(store.root / "cells")  # compacted again: a plain read sees each cell once
    assert len(raw) == 4 and raw.cell_id.is_unique
    assert sorted(f.name for f in (store.root / "cells").rglob("*.parquet")) == ["compacted-2.parquet"]


def test_missing_environment_is_an_unsupported_row_naming_the_fix(ray_local, write_matrix, tmp_path):
    data = copy.deepcopy(SMALL_MATRIX)
    data["axes"]["batch_size"] = [1]
    data["run"]["python"] = {"hf": str(tmp_path / "no-such-venv" / "bin" / "python")}
    store = run_matrix(write_matrix(data), tmp_path / "run")
    row = store.read_cells().iloc[0]
    assert row.status == "unsupported"
    assert "environment not installed" in row.reason and "pip install" in row.reason


def test_bad_dataset_is_a_failed_row_whose_reason_keeps_paths_out(ray_local, write_matrix, tmp_path):
    data = copy.deepcopy(SMALL_MATRIX)
    data["axes"]["batch_size"] = [1]
    # bench validate opens local workload files; one marked cluster_only is opened where the run happens
    data["workload"] = {"kind": "jsonl", "path": str(tmp_path / "missing.jsonl")}
    with pytest.raises(MatrixError, match="workload.path: .*missing.jsonl: no such file"):
        run_matrix(write_matrix(data), tmp_path / "run")
    data["workload"]["cluster_only"] = True
    store = run_matrix(write_matrix(data), tmp_path / "run")
    row = store.read_cells().iloc[0]
    assert row.status == "failed"
    assert row.reason.startswith("preparing prompts: FileNotFoundError") and "missing.jsonl" in row.reason
    assert str(tmp_path) not in row.reason and "<tmp>" in row.reason


def test_repeats_auto_stops_at_the_target_interval_or_its_cap(ray_local, tmp_path, tiny_model, write_matrix):
    """measure.repeats: auto repeats timed batches until the output throughput's 95% interval is within
    auto_repeats.half_width, between min_repeats and max_repeats; the row says how many it took and the
    interval's half-width. A generous target (+-500%: met at the minimum even on a busy machine) stops at
    min_repeats; an impossible one runs to the cap."""
    from adapters.contract.intervals import relative_half_width

    data = copy.deepcopy(SMALL_MATRIX)
    data["axes"]["batch_size"] = [1]
    data["axes"]["input_len"] = [16, 17]        # two cells: one target each
    data["measure"] |= {"repeats": "auto", "auto_repeats": {"min_repeats": 3, "max_repeats": 6, "max_s": 600,
                                                            "half_width": 5.0}}
    wide = run_matrix(write_matrix(data, "wide.yaml"), tmp_path / "wide").read_cells()
    data["measure"]["auto_repeats"]["half_width"] = 1e-9
    tight = run_matrix(write_matrix(data, "tight.yaml"), tmp_path / "tight").read_cells()
    for cells, want in ((wide, 3), (tight, 6)):
        assert set(cells.status) == {"ok"}, cells.reason.tolist()
        for r in cells.itertuples():
            assert r.repeats == want == len(r.output_tok_s_runs) and r.requests == want
            assert r.repeats_halfwidth == pytest.approx(relative_half_width(list(r.output_tok_s_runs)))
    assert (wide.repeats_halfwidth <= 5.0).all() and (tight.repeats_halfwidth > 1e-9).all()


def test_the_groups_first_cell_is_timed_twice_and_the_judge_reads_the_drift(small_run):
    """The drift check (adapters.worker.group.drift_order): the group's first cell's batch is timed at the
    group's start and again, moved, at its end; the judge pools the two measurements' drift into every
    Welch speed interval of the run (orchestrator.judge.speed.run_drift)."""
    from orchestrator.judge.analysis import analyse

    store, _ = small_run
    ok = store.read_cells().query("status == 'ok'")
    twice = [r for r in ok.itertuples() if r.output_tok_s_recheck_runs is not None]
    assert len(twice) == 1 and len(twice[0].output_tok_s_recheck_runs) == M["repeats"]
    assert all(x > 0 for x in twice[0].output_tok_s_recheck_runs)
    rows = analyse(store.root).set_index("cell_id")
    welch = rows[rows.speed_test == "Welch t"]
    assert len(welch) and set(welch.speed_drift) == {"1 cell(s) measured twice in this run"}
    assert (welch.speed_drift_sd >= 0).all()
