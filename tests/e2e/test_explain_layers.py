"""`bench explain RUN CELL --layers` for real: llama.cpp's default cell on the built-in model (its f16 KV cache and
flash attention, near-lossless against transformers) captured through llama.cpp's eval callback, transformers'
baseline twice through its hidden states, each in an engine child placed by Ray, every block split at its
attention; the report names block 0's attention (where the f16 cache enters) as the first beyond the floor, the
embeddings within it, and is stored
(layers.json sealed, layers.parquet with page checksums) and said in one line."""

from __future__ import annotations

import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.execution.runner import run_matrix
from orchestrator.judge.analysis import analyse
from orchestrator.store.layers_file import LAYERS_FILE, layers_dir, read_layers
from tests.helpers import EXPLAIN_MATRIX

MATRIX = EXPLAIN_MATRIX | {"name": "layers"}


def test_explain_layers_names_the_first_block_beyond_the_floor(ray_local, tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(MATRIX))
    run = tmp_path / "run"
    run_matrix(path, run, quiet=True)
    cell = analyse(run).query("framework == 'llamacpp'").iloc[0]
    assert cell.verdict == "near-lossless", cell.verdict_reason

    done = CliRunner().invoke(app, ["explain", str(run), cell.cell_id[:8], "--layers"])
    assert done.exit_code == 0, done.output + repr(done.exception)
    report, table = read_layers(run, cell.cell_id)
    assert report["reason"] is None, report["reason"]
    assert report["first_beyond"] == 0 and not report["embeddings_beyond"], report
    assert report["first_part"] == "attention" and report["split"], report   # where the f16 KV cache enters
    assert report["prompts"] == 2 and report["blocks"] == 2 and report["positions"] == 128
    assert table.column("layer").to_pylist() == [-1, 0, 0, 1, 1]
    assert table.column("part").to_pylist() == [None, "attention", "FFN", "attention", "FFN"]
    floors = table.column("floor").to_pylist()
    assert all(f == 0.0 for f in floors), floors            # transformers repeats itself bit for bit on a CPU
    assert "leaves the noise floor at layer 0 (attention)" in done.output
    # the culprit search's explain.json is not written by --layers
    assert (layers_dir(run, cell.cell_id) / LAYERS_FILE).exists()
    assert not (layers_dir(run, cell.cell_id) / "explain.json").exists()

    # report.html and report.md show it under "Why is this cell lossy"
    assert CliRunner().invoke(app, ["report", str(run)]).exit_code == 0
    md, html = (run / "report.md").read_text(), (run / "report.html").read_text()
    assert f"layers of {cell.cell_id}" in md and "leaves the noise floor at layer 0 (attention)" in md
    assert "block 0 attention" in md and f'id="layers-{cell.cell_id}"' in html
