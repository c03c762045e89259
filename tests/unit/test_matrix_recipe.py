"""`quantization: [q8_0, {recipe: path}]`: a recipe file (orchestrator/matrix/recipes.py) named by a matrix, found
like the matrix's other paths, checked before any engine starts, read into the matrix, named recipe-<name> in cells
and rows, its digest in the cell's id; llamacpp runs it through tensor_types, other engines say unsupported."""

from __future__ import annotations

import os
import sys

import pytest
import yaml

from orchestrator.execution.engine_child.spec import GroupJob, unsupported_reason
from orchestrator.execution.engine_child.supervisor import run_group
from orchestrator.matrix.cells import expand, group
from orchestrator.matrix.models import Matrix, MatrixError
from orchestrator.matrix.recipes import RecipeFile, parse_recipe, write_recipe
from orchestrator.matrix.validate import load_matrix

RECIPE = {"name": "tiny-mix", "base": "q4_0",
          "tensor_types": {r"^blk\.0\.attn_q\.weight$": "q8_0", ".": "f32"},
          "provenance": {"source_run": "r1", "cell": "abc", "kl_budget": 0.005, "kl_mean": 0.004,
                         "kl_lo": 0.003, "kl_hi": 0.005}}


def _write(tmp_path, recipe=RECIPE, frameworks=("llamacpp",), where="r.yaml", quant=None):
    (tmp_path / "sub").mkdir(exist_ok=True)
    if recipe is not None:
        (tmp_path / where).write_text(recipe if isinstance(recipe, str) else yaml.safe_dump(recipe))
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({"models": {"tiny": "builtin:tiny"},
                                    "axes": {"framework": list(frameworks), "model": ["tiny"],
                                             "quantization": quant or ["q8_0", {"recipe": where}]}}))
    return path


def test_a_recipe_is_a_cell_named_by_its_short_form_with_its_types_as_options(tmp_path, monkeypatch):
    monkeypatch.chdir("/")                                     # found against the matrix's folder, not the cwd
    m, _ = load_matrix(_write(tmp_path))
    q8, mix = expand(m)
    assert (q8.quantization, q8.level, q8.options) == ("q8_0", None, {})
    assert mix.quantization == "recipe-tiny-mix" and mix.level == "q4_0"
    assert mix.options == {"tensor_types": RECIPE["tensor_types"]}
    (g8, gmix) = group([q8, mix])
    assert (g8.engine_quantization, gmix.engine_quantization) == ("q8_0", "q4_0")
    # the manifest holds what ran: the matrix dumped and read back expands to the same cells, no file needed
    (tmp_path / "r.yaml").unlink()
    again = Matrix.model_validate(m.model_dump())
    assert [c.cell_id for c in expand(again)] == [q8.cell_id, mix.cell_id]


def test_an_edited_recipe_file_is_another_cell_and_a_nameless_one_is_named_by_its_digest(tmp_path):
    first = expand(load_matrix(_write(tmp_path))[0])[1]
    edited = expand(load_matrix(_write(tmp_path, RECIPE | {"tensor_types": {".": "q8_0"}}))[0])[1]
    assert first.quantization == edited.quantization and first.cell_id != edited.cell_id
    assert first.engine_key != edited.engine_key
    # the same types, a comment added: the bytes changed, so the cell did (its digest is in the id)
    commented = expand(load_matrix(_write(tmp_path, "# note\n" + yaml.safe_dump(RECIPE)))[0])[1]
    assert commented.cell_id != first.cell_id
    nameless = {k: v for k, v in RECIPE.items() if k != "name"}
    cell = expand(load_matrix(_write(tmp_path, nameless))[0])[1]
    import hashlib

    assert cell.quantization == "recipe-" + hashlib.sha256((tmp_path / "r.yaml").read_bytes()).hexdigest()[:8]


@pytest.mark.parametrize("recipe, says", [
    (RECIPE | {"base": "fp16"}, "base: 'fp16' is not a level llama.cpp applies overrides over"),
    (RECIPE | {"tensor_types": {"(": "q8_0"}}, "is not a regular expression"),
    (RECIPE | {"tensor_types": {".": "q9_9"}}, "the type must be one of"),
    (RECIPE | {"tensor_types": {}}, "tensor_types"),
    (RECIPE | {"nme": "x"}, "nme"),
    (RECIPE | {"name": "a b/c"}, "name: 'a b/c' must be"),
    ("base: [unclosed", "is not YAML"),
    ("- just\n- a list\n", "(top level)"),
])
def test_bad_recipe_content_is_one_line_naming_the_file_before_any_engine(tmp_path, recipe, says):
    with pytest.raises(MatrixError) as err:
        load_matrix(_write(tmp_path, recipe))
    assert err.value.problems == [p for p in err.value.problems if p.startswith("axes.quantization[1].recipe: ")]
    (line,) = err.value.problems
    assert says in line and str(tmp_path / "r.yaml") in line and "\n" not in line


def test_a_recipe_path_is_found_like_other_matrix_paths_and_must_be_a_small_regular_file(tmp_path):
    with pytest.raises(MatrixError, match=r"axes.quantization\[1\].recipe: 'gone.yaml' not found"):
        load_matrix(_write(tmp_path, None, where="gone.yaml"))
    (tmp_path / "dir.yaml").mkdir()
    with pytest.raises(MatrixError, match="is not a regular file"):
        load_matrix(_write(tmp_path, None, where="dir.yaml"))
    big = "# " + "x" * (2**20) + "\n" + yaml.safe_dump(RECIPE)
    with pytest.raises(MatrixError, match="bytes; at most 1,048,576"):
        load_matrix(_write(tmp_path, big))
    os.mkfifo(tmp_path / "pipe.yaml")
    with pytest.raises(MatrixError, match="is not a regular file"):
        load_matrix(_write(tmp_path, None, where="pipe.yaml"))
    # a recipe in a subfolder, named relative to the matrix's folder
    (tmp_path / "sub" / "r.yaml").write_text(yaml.safe_dump(RECIPE))
    assert expand(load_matrix(_write(tmp_path, None, where="sub/r.yaml"))[0])[1].quantization == "recipe-tiny-mix"


def test_rules_name_a_recipe_by_its_short_form(tmp_path):
    path = _write(tmp_path, frameworks=("llamacpp", "hf"))
    data = yaml.safe_load(path.read_text()) | {"exclude": [{"framework": "hf", "quantization": "recipe-tiny-mix"}]}
    path.write_text(yaml.safe_dump(data))
    cells = expand(load_matrix(path)[0])
    assert [(c.framework, c.quantization) for c in cells] == [("llamacpp", "q8_0"), ("llamacpp", "recipe-tiny-mix"),
                                                             ("hf", "q8_0")]
    # an include rule naming it adds the recipe's cell itself (its level and types), at other axis values
    data["include"] = [{"framework": "llamacpp", "quantization": "recipe-tiny-mix", "batch_size": 4}]
    path.write_text(yaml.safe_dump(data))
    added = expand(load_matrix(path)[0])[-1]
    assert (added.quantization, added.level, added.batch_size) == ("recipe-tiny-mix", "q4_0", 4)
    assert added.options == {"tensor_types": RECIPE["tensor_types"]}
    data["include"] = [{"framework": "llamacpp", "quantization": "recipe-tyop", "batch_size": 4}]
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(MatrixError, match=r"include\[0\].quantization: 'recipe-tyop' names no recipe of "
                                          r"axes.quantization \(they are: recipe-tiny-mix\)"):
        load_matrix(path)


def test_an_engine_without_tensor_types_runs_no_recipe_one_line_before_it_starts(tmp_path):
    m, _ = load_matrix(_write(tmp_path, frameworks=("hf", "llamacpp")))
    jobs = [GroupJob(run_id="r", group=g, matrix=m, device="cpu", python=sys.executable, cache_dir="/nonexistent")
            for g in group(expand(m))]
    hf = next(j for j in jobs if j.group.framework == "hf" and j.group.level)
    reason = unsupported_reason(hf, sys.executable)
    assert reason.startswith("hf runs no per-tensor recipe (recipe-tiny-mix)") and "\n" not in reason
    rows = run_group(hf)   # returns at once: no process, no model
    assert [r.row["status"] for r in rows] == ["unsupported"] and rows[0].row["quantization"] == "recipe-tiny-mix"
    llama = next(j for j in jobs if j.group.framework == "llamacpp" and j.group.level)
    assert unsupported_reason(llama, sys.executable) is None


def test_the_written_recipe_reads_back_as_written():
    r = parse_recipe(RECIPE)
    text = write_recipe(r)
    assert text.startswith("# ") and parse_recipe(yaml.safe_load(text)) == r
    assert isinstance(r, RecipeFile) and r.provenance.kl_hi == 0.005


def test_a_recipe_with_an_imatrix_gives_the_file_to_the_cell_after_checking_its_sha256(tmp_path):
    import hashlib

    (tmp_path / "imatrix.npz").write_bytes(b"not read here: the engine reads it")
    sha = hashlib.sha256(b"not read here: the engine reads it").hexdigest()
    m, _ = load_matrix(_write(tmp_path, RECIPE | {"imatrix": "imatrix.npz", "imatrix_sha256": sha}))
    mix = expand(m)[1]
    assert mix.options == {"tensor_types": RECIPE["tensor_types"], "imatrix": str(tmp_path / "imatrix.npz")}
    with pytest.raises(MatrixError, match="imatrix: .* has sha256 .*, not the recipe's 00000000"):
        load_matrix(_write(tmp_path, RECIPE | {"imatrix": "imatrix.npz", "imatrix_sha256": "0" * 64}))
    with pytest.raises(MatrixError, match="imatrix: .*none.npz' cannot be read .*copy it beside the recipe"):
        load_matrix(_write(tmp_path, RECIPE | {"imatrix": "none.npz", "imatrix_sha256": sha}))
    with pytest.raises(ValueError, match="imatrix and imatrix_sha256 come together"):
        parse_recipe(RECIPE | {"imatrix": "imatrix.npz"})
