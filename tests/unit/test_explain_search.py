"""The culprit search's logic (orchestrator/explain/search.py) on known answers, and the suspects each adapter
declares (orchestrator/explain/suspects.py). The probes here are a rule over the moved set, standing in for the
verdicts; the search with real engines is tests/e2e/test_explain.py."""

from __future__ import annotations

import pytest

from adapters import ADAPTERS
from orchestrator.explain.search import search
from orchestrator.explain.suspects import find_suspects, moved_options
from orchestrator.store.explain_file import Probe


def prober(restores, status=lambda moved: "ok"):
    """A Prober whose probe of a set restores when restores(set); counts the distinct sets probed."""
    seen: dict[frozenset, Probe] = {}

    def probe(sets):
        for s, phase in sets:
            if s not in seen:
                ok = status(s) == "ok"
                seen[s] = Probe(index=len(seen), round=0, phase=phase, moved=sorted(s), status=status(s),
                                verdict=("lossless" if restores(s) else "near-lossless") if ok else None,
                                restores=ok and restores(s))
        return [seen[s] for s, _ in sets]

    probe.seen = seen
    return probe


def test_one_suspect_alone_is_named_in_the_first_round():
    p = prober(lambda s: "kv" in s)
    found = search(["kv", "fa", "threads"], p)
    assert (found.outcome, found.culprits) == ("culprit", [["kv"]])
    assert len(p.seen) == 5          # as is, all, three alone


def test_two_flags_that_matter_only_together_are_found_by_ddmin():
    p = prober(lambda s: {"b", "e"} <= s)
    found = search(list("abcdefgh"), p)
    assert (found.outcome, found.culprits) == ("culprit", [["b", "e"]])
    assert "together" in found.summary and "any one of them back" in found.summary
    assert len(p.seen) == 23         # 10 in the first round, then 13 of ddmin, one at a time


def test_nothing_restores_means_the_engine_differs():
    found = search(["kv", "fa"], prober(lambda s: False))
    assert found.outcome == "engine" and found.culprits == []


def test_a_verdict_that_does_not_reproduce_is_said():
    assert search(["kv"], prober(lambda s: True)).outcome == "not-reproduced"


def test_a_crashed_probe_restores_nothing_and_a_crashed_cell_fails_the_search():
    p = prober(lambda s: "kv" in s, status=lambda s: "crashed" if s == {"kv"} else "ok")
    found = search(["kv", "fa"], p)
    # kv alone would restore, but its probe crashed: the search can only name the set that did restore
    assert (found.outcome, found.culprits) == ("culprit", [["kv", "fa"]])
    assert p.seen[frozenset({"kv"})].restores is False
    assert search(["kv"], prober(lambda s: False, status=lambda s: "crashed")).outcome == "failed"


def test_the_budget_stops_the_search_and_says_so():
    found = search(list("abcdefgh"), prober(lambda s: {"b", "e"} <= s), max_probes=11)
    assert found.outcome == "budget"


def test_no_suspects_needs_no_probe():
    found = search([], prober(lambda s: False))
    assert found.outcome == "no-suspects" and "engine itself" in found.summary


def test_every_declared_numerics_flag_names_fields_of_its_options():
    for name in ADAPTERS:
        adapter = ADAPTERS[name]
        assert adapter.numerics_flags, f"{name} declares no numerics flags"
        for flag in adapter.numerics_flags:
            assert set(flag.reference) <= set(adapter.Options.model_fields), (name, flag.name)


def test_llamacpp_default_against_hf_suspects_the_kv_cache_and_flash_attention():
    suspects, skipped = find_suspects("llamacpp", {}, "q8_0", 4, {"framework": "hf", "quantization": "fp32",
                                                                  "options": {}})
    assert [s.name for s in suspects] == ["kv_cache_types", "flash_attn", "batch_size=1", "quantization=fp32"]
    moved = moved_options(ADAPTERS["llamacpp"], {"n_threads": 2}, suspects[:2])
    assert moved == {"n_threads": 2, "type_k": "f32", "type_v": "f32", "flash_attn": "off"}
    # the f32_kv flag set of the smoke matrix has nothing left to move but the batch size
    suspects, _ = find_suspects("llamacpp", {"type_k": "f32", "type_v": "f32", "flash_attn": "off"}, "fp32", 4,
                                {"framework": "hf", "quantization": "fp32", "options": {}})
    assert [s.name for s in suspects] == ["batch_size=1"]


def test_against_the_same_engine_a_probe_moves_to_the_baselines_values():
    suspects, _ = find_suspects("vllm", {"kv_cache_dtype": "fp8", "enforce_eager": True}, "fp32", 1,
                                {"framework": "vllm", "quantization": "fp32", "options": {"enforce_eager": True}})
    assert [s.name for s in suspects] == ["kv_cache_dtype"]
    assert moved_options(ADAPTERS["vllm"], {"kv_cache_dtype": "fp8", "enforce_eager": True}, suspects) == \
        {"enforce_eager": True}


@pytest.mark.parametrize("backend", ["turbomind", "pytorch"])
def test_a_move_that_makes_no_valid_configuration_is_skipped_with_why(backend):
    suspects, skipped = find_suspects("lmdeploy", {"backend": backend}, "fp16", 1,
                                      {"framework": "hf", "quantization": "fp16", "options": {}})
    names = [s.name for s in suspects]
    if backend == "turbomind":
        assert "graphs" in skipped and "graphs" not in names
    else:
        assert "graphs" in names and not skipped


def test_the_probe_matrix_holds_the_baseline_and_one_cell_per_moved_set():
    import pandas as pd

    from orchestrator.explain.probes import ProbeRunner
    from orchestrator.matrix.cells import expand
    from orchestrator.matrix.validate import load_matrix, parse_matrix
    from tests.helpers import ROOT

    m, _ = load_matrix(ROOT / "matrices" / "smoke.yaml")
    axes = {"model": "tiny", "input_len": 32, "output_len": 16, "mode": "offline", "workload": None}
    cell = {"cell_id": "c0ffee", "framework": "llamacpp", "quantization": "fp32", "flags": "default",
            "batch_size": 4, **axes}
    base = pd.DataFrame([{"framework": "hf", "quantization": "fp32", "flags": "default", "batch_size": b, **axes}
                         for b in (1, 4)])
    suspects, _ = find_suspects("llamacpp", {}, "fp32", 4, {"framework": "hf", "quantization": "fp32", "options": {}})
    runner = ProbeRunner(ROOT, m, cell, base, suspects)
    sets = [frozenset(), frozenset({"kv_cache_types", "batch_size=1"})]
    probe_m = parse_matrix(runner.matrix_data(sets))
    got = {(c.framework, c.flags, c.batch_size): c.options for c in expand(probe_m)}
    assert got == {("hf", "default", 1): {}, ("hf", "default", 4): {}, ("llamacpp", "xp-as-is", 4): {},
                   ("llamacpp", "xp-kv_cache_types", 1): {"type_k": "f32", "type_v": "f32"}}
    # the logit and text layers only, scored as the run scored
    assert (probe_m.measure.repeats, probe_m.measure.warmup, probe_m.measure.sampling, probe_m.tasks) == (1, 0, None, [])
    assert probe_m.measure.scoring_prompts == m.measure.scoring_prompts and probe_m.baseline == m.baseline
    # the same moves make the same cell ids in a later round (the cache across rounds and calls)
    again = parse_matrix(runner.matrix_data(list(reversed(sets))))
    assert {c.cell_id for c in expand(again)} == {c.cell_id for c in expand(probe_m)}


def test_an_env_pair_suspects_the_environment_apart_from_the_flags():
    """A cell in another engine environment than its baseline's: the environment is a suspect of its own (first),
    and a probe that moves it is the same configuration in the baseline's env, beside flag moves in the cell's."""
    import sys

    import pandas as pd

    from orchestrator.explain.probes import ProbeRunner
    from orchestrator.matrix.cells import expand
    from orchestrator.matrix.validate import parse_matrix
    from tests.helpers import ROOT

    base_opts = {"framework": "llamacpp", "quantization": "fp32", "options": {"type_k": "f32", "type_v": "f32"}}
    suspects, _ = find_suspects("llamacpp", {}, "fp32", 1, base_opts | {"env": "old"}, env="new")
    assert [s.name for s in suspects][:1] == ["env=old"] and suspects[0].kind == "environment"
    assert "kv_cache_types" in [s.name for s in suspects]
    same_env, _ = find_suspects("llamacpp", {}, "fp32", 1, base_opts | {"env": "new"}, env="new")
    assert "env=old" not in [s.name for s in same_env] and [s.kind for s in same_env] == ["flag"] * len(same_env)

    m = parse_matrix({
        "models": {"tiny": "builtin:tiny"},
        "axes": {"framework": ["llamacpp"], "model": ["tiny"], "env": ["old", "new"], "flags": ["default", "f32_kv"]},
        "envs": {"old": {"python": sys.executable}, "new": {"python": sys.executable}},
        "flags": {"llamacpp": {"f32_kv": {"type_k": "f32", "type_v": "f32"}}}})
    axes = {"model": "tiny", "input_len": 32, "output_len": 16, "mode": "offline", "workload": None}
    cell = {"cell_id": "c0ffee", "framework": "llamacpp", "quantization": "fp32", "flags": "default", "batch_size": 1,
            "env": "new", **axes}
    base = pd.DataFrame([{"framework": "llamacpp", "quantization": "fp32", "flags": "f32_kv", "batch_size": 1,
                          "env": "old", **axes}])
    runner = ProbeRunner(ROOT, m, cell, base, suspects)
    probe_m = parse_matrix(runner.matrix_data([frozenset(), frozenset({"env=old"}), frozenset({"kv_cache_types"})]))
    got = {(c.flags, c.env) for c in expand(probe_m)}
    assert got == {("f32_kv", "old"), ("xp-as-is", "new"), ("xp-as-is", "old"), ("xp-kv_cache_types", "new")}
