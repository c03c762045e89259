"""An importance matrix from the run's own scoring prompts, for real: computed by llama.cpp's F32 graph through its
eval callback (adapters/engines/llamacpp/imatrix.py), handed to llama.cpp's quantizer, and the q4_0 file made with
it judged against fp32 beside the one made without, as cells of one run on a real Ray cluster; then
`bench explain --recipe --imatrix` on the built-in model."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from adapters.engines.llamacpp.tensor_mix import gguf_tensor_types
from orchestrator.cli import app
from orchestrator.execution.runner import run_matrix
from orchestrator.execution.engine_child.rows import local_path
from orchestrator.explain.recipe import IMATRIX_FILE, gguf_files, run_imatrix, sha256_file
from orchestrator.judge.analysis import KL_INTERVAL, analyse, kl_intervals
from orchestrator.matrix.validate import parse_matrix

MEASURE = {"warmup": 0, "repeats": 1, "scoring_prompts": 4, "scoring_len": 64, "greedy_tokens": 4}


def _matrix(model: str, imatrix: str | None) -> dict:
    flags = {"llamacpp": {"imx": {"imatrix": imatrix}}} if imatrix else {}
    return {"name": "imx", "models": {"m": model}, "flags": flags,
            "axes": {"framework": ["llamacpp"], "model": ["m"], "quantization": ["fp32", "q4_0"], "batch_size": [1],
                     "input_len": [16], "output_len": [4]},
            "include": [{"framework": "llamacpp", "quantization": "q4_0", "flags": "imx"}] if imatrix else [],
            "baseline": {"framework": "llamacpp", "quantization": "fp32", "flags": "default"},
            "measure": MEASURE, "run": {"cell_timeout_s": 120, "load_timeout_s": 300}}


@pytest.mark.parametrize("model", ["builtin:tiny", "builtin:tiny-qwen2"])
def test_q4_0_with_the_runs_imatrix_against_without(model, ray_local, tmp_path):
    """The imatrix reaches the quantizer (every weight it names got its data, the bytes differ, the types do not)
    and, measured on the run's scoring prompts, q4_0 with it has a lower KL against fp32 than q4_0 without."""
    m = parse_matrix(_matrix(model, None), "imx.yaml")
    facts = run_imatrix(m, {"model": "m"}, tmp_path / "imx")
    assert facts["prompts"] == 4 and facts["positions"] == 4 * 64 and not facts["reused"]
    arch = {"builtin:tiny": "llama", "builtin:tiny-qwen2": "qwen2"}[model]
    assert facts["architecture"] == arch and facts["weights"] >= 14   # 2 blocks x 7 matmuls (+ output, not tied)
    assert run_imatrix(m, {"model": "m"}, tmp_path / "imx")["reused"]
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(_matrix(model, facts["path"])))
    run_matrix(path, tmp_path / "run", quiet=True)
    df = analyse(tmp_path / "run").drop_duplicates("cell_id").set_index("flags")
    q4 = df[df.quantization == "q4_0"]
    plain, imx = q4.loc["default"], q4.loc["imx"]
    assert plain.status == imx.status == "ok"
    files = gguf_files(tmp_path / "run")
    (_, plain_path), (_, imx_path) = files[plain.cell_id], files[imx.cell_id]
    assert "-im-" in imx_path and "-im-" not in plain_path
    assert sha256_file(plain_path) != sha256_file(imx_path)                         # the imatrix changed the bytes
    assert gguf_tensor_types(local_path(plain_path)) == gguf_tensor_types(local_path(imx_path))   # not the types
    side = json.loads(local_path(imx_path).with_suffix(".json").read_text())
    assert side["imatrix_digest"] == facts["digest"]
    # every weight the imatrix names was found by the quantizer; only the row lookup (token_embd) has no entry
    assert set(side["imatrix_not_found"]) == {"token_embd.weight"}, side["imatrix_not_found"]
    assert len(side["imatrix_entries"]) == facts["weights"]
    both = kl_intervals(tmp_path / "run", {c.cell_id: c.baseline_cell_id for c in (plain, imx)})   # one read
    iv = {"plain": both[plain.cell_id], "imx": both[imx.cell_id]}
    for k, c in (("plain", plain), ("imx", imx)):   # each pair's own KL, as analyse pairs them
        assert iv[k]["kl_mean"] == pytest.approx(c.kl_mean, rel=1e-6), (k, iv[k], c.kl_mean)
        assert iv[k]["kl_lo"] < iv[k]["kl_mean"] < iv[k]["kl_hi"]
    print(f"\n{model}: q4_0 KL vs fp32 without imatrix {plain.kl_mean:.5g} [{iv['plain']['kl_lo']:.4g}, "
          f"{iv['plain']['kl_hi']:.4g}] (top1 {plain.top1:.4f}), with {imx.kl_mean:.5g} [{iv['imx']['kl_lo']:.4g}, "
          f"{iv['imx']['kl_hi']:.4g}] (top1 {imx.top1:.4f}), ratio {imx.kl_mean / plain.kl_mean:.3f}; "
          f"{int(plain.n_positions)} positions, {iv['plain']['n_prompts']} prompts, 95% intervals: {KL_INTERVAL}")
    assert imx.kl_mean < plain.kl_mean, (plain.kl_mean, imx.kl_mean)



def test_recipe_search_with_the_imatrix(ray_local, tmp_path):
    """`bench explain --recipe --imatrix`: the imatrix from the run's scoring prompts, the candidates and the presets
    quantized with it (their files carry its digest), said in the output, recipe.json and recipe.yaml's provenance;
    the flag set it writes names the imatrix, so a matrix naming it runs the same bytes. Beside it, the same search
    without the imatrix (the sensitivities reused): both tables printed."""
    from orchestrator.explain.recipe import PRESETS, RECIPE_FILE, RECIPE_FLAGS, RECIPE_YAML, RecipeResult
    from orchestrator.explain.sensitivity import sensitivity_path

    base = _matrix("builtin:tiny", None)
    data = base | {"measure": MEASURE | {"scoring_prompts": 2, "scoring_len": 32},   # a flag set of the cell's own:
                   "flags": {"llamacpp": {"f32kv": {"type_k": "f32", "type_v": "f32", "flash_attn": "off"}}},
                   "axes": base["axes"] | {"flags": ["f32kv"]},     # its fp32 reference keeps it, without the imatrix
                   "baseline": base["baseline"] | {"flags": "f32kv"}}
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(data))
    run = tmp_path / "run"
    run_matrix(tmp_path / "m.yaml", run, quiet=True)
    cell = analyse(run).drop_duplicates("cell_id").set_index("quantization").loc["q4_0"]
    results = {}
    for name, extra in (("imatrix", ["--imatrix"]), ("plain", [])):
        done = CliRunner().invoke(app, ["explain", str(run), cell.cell_id[:8], "--recipe", "--kl-budget", "0.005",
                                        "-q", *extra])
        assert done.exit_code == 0, done.output + repr(done.exception)
        results[name] = RecipeResult.model_validate_json(sensitivity_path(run, cell.cell_id, RECIPE_FILE).read_text())
        print(done.output)
        if name == "imatrix":
            assert "imatrix: used, from the run's 2 scoring prompts (64 positions" in " ".join(done.output.split())
            written = (run / "explain" / cell.cell_id / RECIPE_YAML).read_text()
            flags = yaml.safe_load((run / "explain" / cell.cell_id / RECIPE_FLAGS).read_text())
    imx, plain = results["imatrix"], results["plain"]
    assert plain.imatrix is None and imx.imatrix is not None and imx.imatrix["positions"] == 64
    assert imx.imatrix["path"] == f"explain/{cell.cell_id}/{IMATRIX_FILE}"   # stored relative to the run folder
    assert [p.name for p in imx.presets] == list(PRESETS) and all(p.status == "ok" for p in imx.presets)
    assert all(c.status == "ok" for c in imx.candidates)
    files = {**gguf_files(run / "explain" / cell.cell_id / "recipe-run-imatrix"),
             **gguf_files(run / "explain" / cell.cell_id / "recipe-candidates-imatrix")}
    for c in [*imx.presets, *imx.candidates, *([imx.recipe] if imx.recipe else [])]:
        side = json.loads(local_path(files[c.cell_id][1]).with_suffix(".json").read_text())
        assert side["imatrix_digest"] == imx.imatrix["digest"], c.name
    q4 = {r: next(p for p in res.presets if p.name == "q4_0") for r, res in results.items()}
    print(f"q4_0 preset KL without imatrix {q4['plain'].kl_mean:.4g}, with {q4['imatrix'].kl_mean:.4g}; recipe "
          f"without {plain.recipe and plain.recipe.file_bytes} B, with {imx.recipe and imx.recipe.file_bytes} B")
    assert q4["imatrix"].gguf_sha256 != q4["plain"].gguf_sha256
    if imx.recipe is not None:
        prov = yaml.safe_load(written)["provenance"]
        assert prov["imatrix"]["used"] and prov["imatrix"]["sha256"] == imx.imatrix["digest"]
        assert str(tmp_path) not in written
        assert flags["flags"]["llamacpp"]["recipe"]["imatrix"] == str(run / imx.imatrix["path"])
        _shipped_with_its_imatrix(run / "explain" / cell.cell_id, written, imx, data, tmp_path)


def _shipped_with_its_imatrix(folder, written: str, result, data: dict, tmp_path) -> None:
    """recipe.yaml and imatrix.npz copied to another folder and named by a new matrix run the winner's bytes; the
    recipe without its imatrix file is refused at load, in one line."""
    import shutil

    from orchestrator.matrix.models import MatrixError
    from orchestrator.matrix.validate import load_matrix

    spec = yaml.safe_load(written)
    assert spec["imatrix"] == IMATRIX_FILE and spec["imatrix_sha256"] == sha256_file(str(folder / IMATRIX_FILE))
    ship = tmp_path / "ship"
    ship.mkdir()
    (ship / "r.yaml").write_text(written)
    (ship / "m.yaml").write_text(yaml.safe_dump(data | {"axes": data["axes"] | {"quantization": ["fp32", {"recipe": "r.yaml"}]}}))
    with pytest.raises(MatrixError, match="imatrix: .*cannot be read"):
        load_matrix(ship / "m.yaml")
    shutil.copy(folder / IMATRIX_FILE, ship / IMATRIX_FILE)
    run_matrix(ship / "m.yaml", ship / "run", quiet=True)
    df = analyse(ship / "run").drop_duplicates("cell_id").set_index("quantization")
    row = df.loc[f"recipe-{spec['name']}"]
    assert row.status == "ok", row.to_dict()
    size, path = gguf_files(ship / "run")[row.cell_id]
    assert size == result.recipe.file_bytes and sha256_file(path) == result.recipe.gguf_sha256 is not None
