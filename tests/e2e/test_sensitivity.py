"""`bench explain --sensitivity` for real: the built-in model's q4_0 and q8_0 llama.cpp cells, each tensor group
quantized alone by llama.cpp's quantizer (`tensor_types`, its tt_overrides), the files read back with gguf-py,
every probe a stored cell of a probe run on a real Ray cluster, judged against the same engine at fp32."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import yaml
from typer.testing import CliRunner

from adapters.engines.llamacpp.tensor_mix import gguf_tensor_types, group_tensor_types, mixed_gguf, tensor_groups
from orchestrator.cli import app
from orchestrator.execution.runner import run_matrix
from orchestrator.explain.sensitivity import ALL, SENS_TABLE, SensitivityResult, sensitivity_path
from orchestrator.judge.analysis import analyse
from orchestrator.store.run_store import RunStore

MATRIX = {
    "name": "sens",
    "models": {"tiny": "builtin:tiny"},
    "axes": {"framework": ["llamacpp"], "model": ["tiny"], "quantization": ["fp32", "q8_0", "q4_0"],
             "batch_size": [1], "input_len": [16], "output_len": [4]},
    "baseline": {"framework": "llamacpp", "quantization": "fp32"},
    "measure": {"warmup": 0, "repeats": 1, "scoring_prompts": 2, "scoring_len": 32, "greedy_tokens": 4},
    "run": {"cell_timeout_s": 120, "load_timeout_s": 300},
}


def test_one_group_override_quantizes_that_group_only(tiny_model, cache_dir):
    """The file made for one group has exactly that group's tensor at the cell's type; every other weight is F32."""
    from adapters.engines.llamacpp.gguf_convert import gguf_for

    for level in ("q4_0", "q8_0"):
        cell_file, _ = gguf_for(str(tiny_model), level, str(cache_dir))
        groups = tensor_groups(cell_file)
        assert {"token_embd", "blk.0.attn_q", "blk.1.ffn_down"} <= {g["group"] for g in groups}
        cell_types = gguf_tensor_types(cell_file)
        for g in (groups[0], next(g for g in groups if g["group"] == "blk.1.ffn_up")):
            path, facts = mixed_gguf(str(tiny_model), level, group_tensor_types([g]), str(cache_dir))
            types = gguf_tensor_types(path)
            assert set(types) == set(cell_types)
            name = f"{g['group']}.weight"
            assert types[name] == cell_types[name] == g["type"] != "f32"
            assert {t for n, t in types.items() if n != name} == {"f32"}, types
            assert facts["tensor_types"] == list(group_tensor_types([g]).items())
        # every group at once: the cell's own types, tensor by tensor
        everything, _ = mixed_gguf(str(tiny_model), level, group_tensor_types(groups), str(cache_dir))
        assert gguf_tensor_types(everything) == cell_types


def _sensitivity(run, cell_id: str) -> tuple[str, SensitivityResult]:
    done = CliRunner().invoke(app, ["explain", str(run), cell_id[:8], "--sensitivity", "-q"])
    assert done.exit_code == 0, done.output + repr(done.exception)
    # as stored: the probes' run relative to the run folder (no machine path in results)
    return done.output, SensitivityResult.model_validate_json(sensitivity_path(run, cell_id).read_text())


def test_sensitivity_tables_for_q4_0_and_q8_0(ray_local, tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(MATRIX))
    run = tmp_path / "run"
    run_matrix(path, run, quiet=True)
    df = analyse(run).drop_duplicates("cell_id").set_index("quantization")
    tables = {}
    for level in ("q4_0", "q8_0"):
        out, result = _sensitivity(run, df.loc[level, "cell_id"])
        tables[level] = result
        assert "sensitivity" in out and "blk.0.attn_q" in out
        assert all(g.status == "ok" and g.kl_mean is not None and g.n_positions for g in result.groups), result.groups
        groups = [g for g in result.groups if g.group != ALL]
        assert len(groups) == 16 and all(0 < g.bytes < g.f32_bytes for g in groups)
        every = next(g for g in result.groups if g.group == ALL)
        assert every.bytes == sum(g.bytes for g in groups)
        # every group quantized is the cell's own file: its KL against fp32 is the cell's, up to the run-to-run floor
        assert abs(every.kl_mean - df.loc[level, "kl_mean"]) <= 0.1 * df.loc[level, "kl_mean"] + 1e-6
        # each group alone moves less than all of them
        assert max(g.kl_mean for g in groups) <= every.kl_mean * 1.5
        stored = pq.read_table(sensitivity_path(run, result.cell_id, SENS_TABLE)).to_pandas()
        assert list(stored.group) == [g.group for g in result.groups]
        # each probe is a stored cell of the probe run, its matrix beside it
        assert {g.cell_id for g in result.groups} <= set(RunStore(run / result.probe_run).read_cells().cell_id)
    q4 = {g.group: g.kl_mean for g in tables["q4_0"].groups}
    q8 = {g.group: g.kl_mean for g in tables["q8_0"].groups}
    mean = lambda d: sum(v for k, v in d.items() if k != ALL) / (len(d) - 1)
    assert mean(q4) > mean(q8) and q4[ALL] > q8[ALL], (q4, q8)
    # asked again: every probe is stored, none runs twice
    before = len(RunStore(run / tables["q8_0"].probe_run).read_cells())
    _, again = _sensitivity(run, tables["q8_0"].cell_id)
    assert len(RunStore(run / again.probe_run).read_cells()) == before
    assert [g.kl_mean for g in again.groups] == [g.kl_mean for g in tables["q8_0"].groups]
    print(json.dumps({lv: [(g.group, g.type, g.bytes, g.kl_mean, g.top1) for g in t.groups] for lv, t in tables.items()}))


def test_recipe_within_a_budget_between_q8_0_and_q4_0(ray_local, tmp_path):
    from orchestrator.explain.recipe import PRESETS, RECIPE_FILE, RECIPE_FLAGS, RecipeResult

    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(MATRIX | {"axes": MATRIX["axes"] | {"quantization": ["fp32", "q4_0"]}}))
    run = tmp_path / "run"
    run_matrix(path, run, quiet=True)
    cell = analyse(run).drop_duplicates("cell_id").set_index("quantization").loc["q4_0"]
    budget = 0.005                                   # q8_0 ~3e-4, q4_0 ~3e-2 on the built-in model
    done = CliRunner().invoke(app, ["explain", str(run), cell.cell_id[:8], "--recipe", "--kl-budget", str(budget), "-q"])
    assert done.exit_code == 0, done.output + repr(done.exception)
    result = RecipeResult.model_validate_json(sensitivity_path(run, cell.cell_id, RECIPE_FILE).read_text())
    print(done.output, "kept:", result.recipe and result.recipe.kept)
    assert len(result.candidates) == 17 and all(c.status == "ok" and c.file_bytes for c in result.candidates)
    sizes = [c.file_bytes for c in result.candidates]
    assert sizes == sorted(sizes)                    # each candidate keeps one more group at q8_0
    assert not result.candidates[0].within_budget and result.candidates[-1].within_budget
    assert result.recipe is not None and result.recipe.within_budget and result.recipe.kl_mean <= budget
    assert [p.name for p in result.presets] == list(PRESETS) and all(p.status == "ok" for p in result.presets)
    assert all(p.output_tok_s and p.speedup for p in [result.recipe, *result.presets])
    meeting = [p for p in result.presets if p.within_budget]
    beats = all(result.recipe.file_bytes < p.file_bytes for p in meeting)
    assert ("smaller than every preset" in result.summary) == (beats and bool(meeting)), result.summary
    # the recipe is a flag set a matrix names again: the same tensor_types, the same file, the same cell
    flags = yaml.safe_load((run / "explain" / cell.cell_id / RECIPE_FLAGS).read_text())
    assert flags["flags"]["llamacpp"]["recipe"]["tensor_types"] == result.tensor_types
    # 'within budget' reads the KL interval's upper bound (over the 2 scoring prompts), for the presets too
    for c in [result.recipe, *result.presets]:
        assert c.kl_lo <= c.kl_mean <= c.kl_hi and c.n_prompts == 2, c
        assert c.within_budget == (c.kl_hi <= budget)
        assert c.mean_within == (c.kl_mean <= budget)
    assert ("may exceed" in result.summary) == any(c.mean_within and not c.within_budget
                                                   for c in [result.recipe, *result.presets]), result.summary
    _recipe_as_a_quantization_value(run, cell.cell_id, result, tmp_path)


def _recipe_as_a_quantization_value(run, cell_id: str, result, tmp_path) -> None:
    """recipe.yaml named by a new matrix (`quantization: [fp32, {recipe: r.yaml}]`) runs the search's winner:
    the same GGUF bytes and the same KL against fp32."""
    from orchestrator.explain.recipe import RECIPE_YAML, gguf_files, sha256_file

    written = (run / "explain" / cell_id / RECIPE_YAML).read_text()
    spec = yaml.safe_load(written)
    assert spec["base"] == "q4_0" and spec["tensor_types"] == result.tensor_types
    assert str(tmp_path) not in written and "/" not in spec["provenance"]["source_run"]   # no machine paths
    assert spec["provenance"]["kl_lo"] <= spec["provenance"]["kl_mean"] <= spec["provenance"]["kl_hi"]
    ship = tmp_path / "ship"
    ship.mkdir()
    (ship / "r.yaml").write_text(written)
    (ship / "m.yaml").write_text(yaml.safe_dump(MATRIX | {"axes": MATRIX["axes"] | {
        "quantization": ["fp32", {"recipe": "r.yaml"}]}}))
    run_matrix(ship / "m.yaml", ship / "run", quiet=True)
    df = analyse(ship / "run").drop_duplicates("cell_id").set_index("quantization")
    row = df.loc[f"recipe-{spec['name']}"]
    assert row.status == "ok", row.to_dict()
    size, path = gguf_files(ship / "run")[row.cell_id]
    assert size == result.recipe.file_bytes
    assert sha256_file(path) == result.recipe.gguf_sha256 == spec["provenance"]["gguf_sha256"] is not None
    assert abs(row.kl_mean - result.recipe.kl_mean) <= 1e-6 * result.recipe.kl_mean, (row.kl_mean, result.recipe.kl_mean)
