"""The report's panel for `bench explain --sensitivity` and `--recipe` (orchestrator/report/panels/mixes.py), in
report.md and report.html: the group table, the recipe beside the presets with the KL interval and whether its upper
bound is within the budget, and a line for an explained cell that has neither."""

from __future__ import annotations

from orchestrator.explain.recipe import Candidate, RecipeResult, budget_text, summary
from orchestrator.explain.sensitivity import GroupProbe, SensitivityResult
from orchestrator.report import html, md
from orchestrator.report.panels.mixes import load_mixes, none_line
from orchestrator.report.panels.searches import load_culprits


def _c(name, nbytes, kl, lo, hi, budget=3e-3, **kw):
    c = Candidate(name=name, quantization=kw.pop("quantization", name), cell_id=f"id-{name}", status="ok",
                  file_bytes=nbytes, kl_mean=kl, kl_lo=lo, kl_hi=hi, n_prompts=8, **kw)
    c.mean_within = kl <= budget
    c.within_budget = c.mean_within and hi is not None and hi <= budget
    return c


def _write(root):
    folder = root / "explain" / "cellaaaa11112222"
    folder.mkdir(parents=True)
    sens = SensitivityResult(run=str(root), cell_id="cellaaaa11112222", config="llamacpp/tiny/q4_0/default/b1",
                             quantization="q4_0", reference="llamacpp/tiny/fp32/default/b1", probe_run="p",
                             groups=[GroupProbe(group="blk.0.attn_q", type="q4_0", bytes=9216, f32_bytes=65536,
                                                status="ok", kl_mean=2.0e-3, top1=0.97),
                                     GroupProbe(group="output", type="q8_0", status="failed", reason="it broke")])
    recipe = _c("recipe", 374_496, 2.9e-3, 2.6e-3, 3.2e-3, quantization="q4_0", kept=["a", "b"])
    presets = [_c("q8_0", 505_568, 1.9e-4, 1.5e-4, 2.3e-4), _c("q5_k_m", 400_608, 2.2e-3, 1.9e-3, 2.5e-3),
               _c("q4_k_m", 379_616, 3.1e-3, 2.8e-3, 3.4e-3)]
    result = RecipeResult(run=str(root), cell_id="cellaaaa11112222", quantization="q4_0", kl_budget=3e-3, keep="q8_0",
                          ranking=[], candidates=[], recipe=recipe, presets=presets,
                          summary=summary(recipe, presets, 3e-3), recipe_file="explain/cellaaaa11112222/recipe.yaml")
    (folder / "sensitivity.json").write_text(sens.model_dump_json())
    (folder / "recipe.json").write_text(result.model_dump_json())
    (root / "explain" / "cellbbbb33334444").mkdir()      # explained (e.g. --layers) without either
    return result


def test_the_budget_reads_the_upper_bound_and_names_the_margin():
    c = _c("recipe", 374_496, 2.9e-3, 2.6e-3, 3.2e-3)
    assert budget_text(c, 3e-3) == "KL 0.0029 [0.0026, 0.0032]: may exceed 0.003"
    assert budget_text(_c("q8_0", 1, 1.9e-4, 1.5e-4, 2.3e-4), 3e-3).endswith(": within 0.003")
    assert budget_text(_c("q4_0", 1, 3.1e-2, 2e-2, 4e-2), 3e-3).endswith(": over 0.003")
    nointerval = _c("one", 1, 1e-3, None, None)
    assert budget_text(nointerval, 3e-3) == "KL 0.001 [no interval: 8 prompt(s)]: may exceed 0.003"


def test_summary_says_may_exceed_where_only_the_mean_is_within():
    recipe = _c("recipe", 374_496, 2.9e-3, 2.6e-3, 3.2e-3)
    presets = [_c("q8_0", 505_568, 1.9e-4, 1.5e-4, 2.3e-4), _c("q5_k_m", 400_608, 2.2e-3, 1.9e-3, 2.5e-3),
               _c("q4_k_m", 379_616, 2.95e-3, 2.8e-3, 3.1e-3)]
    s = summary(recipe, presets, 3e-3)
    assert s.startswith("recipe: 374496 bytes, KL 0.0029 [0.0026, 0.0032]: may exceed 0.003")
    assert "smaller than every preset within it (upper bound): q8_0" in s and "q5_k_m" in s
    assert "q4_k_m (379616 bytes, KL 0.0029 [0.0028, 0.0031]: may exceed 0.003)" in s
    inside = _c("recipe", 374_496, 2.0e-3, 1.8e-3, 2.2e-3)
    assert "smaller than every preset that meets it" in summary(inside, presets, 3e-3)
    assert "none beats the presets: q5_k_m" in summary(_c("recipe", 450_000, 2e-3, 1.8e-3, 2.2e-3), presets, 3e-3)


def test_panel_in_both_formats_and_a_line_where_a_cell_has_none(tmp_path):
    _write(tmp_path)
    mixes = load_mixes(tmp_path)
    assert [e.cell_id for e in mixes] == ["cellaaaa11112222", "cellbbbb33334444"]
    assert none_line(mixes[0]) is None
    assert none_line(mixes[1]).startswith("cellbbbb33334444: no sensitivity table and no recipe")
    layer = load_culprits(tmp_path)
    assert layer is not None and not layer.problems
    text = "\n".join(md._culprits(layer))
    assert "| blk.0.attn_q | q4_0 | 9216 | 0.002 | 0.97 | ok |" in text
    assert "failed: it broke" in text
    assert "| recipe | 2 | 374496 | 0.0029 [0.0026, 0.0032] | may exceed |" in text
    assert "| q8_0 | 0 | 505568 | 0.00019 [0.00015, 0.00023] | within |" in text
    assert "cellbbbb33334444: no sensitivity table and no recipe" in text
    page = html._culprit_panel(layer)
    assert "Where the loss comes from" in page and "sens-cellaaaa11112222" in page and "may exceed" in page
    assert "cellbbbb33334444: no sensitivity table and no recipe" in page


def test_a_damaged_file_is_a_problem_line_not_a_figure(tmp_path):
    _write(tmp_path)
    (tmp_path / "explain" / "cellaaaa11112222" / "recipe.json").write_text("{not json")
    layer = load_culprits(tmp_path)
    assert len(layer.problems) == 1 and "cellaaaa11112222/recipe.json" in layer.problems[0]
    assert layer.mixes[0].recipe is None and "no recipe" in none_line(layer.mixes[0])


def test_the_heading_says_when_the_recipe_and_presets_were_quantized_with_an_imatrix():
    from orchestrator.report.panels.mixes import recipe_heading

    r = {"cell_id": "c1", "quantization": "q4_0", "keep": "q8_0", "kl_budget": 0.005}
    assert recipe_heading(r) == "recipe of c1: q4_0, groups kept at q8_0, KL budget 0.005"
    assert recipe_heading(r | {"imatrix": {"prompts": 2, "positions": 64}}).endswith(
        ", recipe and presets quantized with an imatrix of the run's 2 scoring prompts (64 positions)")


def test_explains_results_keep_no_machine_path(tmp_path):
    """recipe.json, sensitivity.json and explain.json store the run by its folder's name and paths inside it
    relative to it (store/explain_file.py portable_json)."""
    import json

    from pydantic import BaseModel

    from orchestrator.store.explain_file import portable_json

    class R(BaseModel):
        run: str
        probe_run: str
        recipe_file: str | None = None
        imatrix: dict | None = None
        cell_id: str = "c"

    run = tmp_path / "results" / "r1"
    r = R(run=str(run), probe_run=str(run / "explain" / "c" / "sensitivity"),
          recipe_file=str(run / "explain" / "c" / "recipe.yaml"),
          imatrix={"path": str(run / "explain" / "c" / "imatrix.npz"), "positions": 64})
    stored = json.loads(portable_json(r, run))
    assert stored == {"run": "r1", "probe_run": "explain/c/sensitivity", "recipe_file": "explain/c/recipe.yaml",
                      "imatrix": {"path": "explain/c/imatrix.npz", "positions": 64}, "cell_id": "c"}
    assert str(tmp_path) not in portable_json(r, run)
