"""Named workloads and the `workload` axis: expansion, ids, validation with YAML paths, the baseline
selector and rows stored before the axis existed (no engine runs here; tests/e2e/test_workloads_run.py
runs a two-workload matrix through real engines)."""

from __future__ import annotations

import json

import pytest

from orchestrator.matrix.baselines import parse_selector
from orchestrator.matrix.cells import expand, group
from orchestrator.matrix.validate import parse_matrix
from orchestrator.store.run_store import RunStore, cells_file_row
from tests.helpers import ROOT, problems

SHAREGPT = str(ROOT / "tests" / "data" / "sharegpt_multiturn.json")
LOGNORMAL = {"kind": "lognormal", "mean": 448, "std": 160, "min": 288, "max": 768}

# single-section matrices whose ids were computed before named workloads existed (main at fdbe40a):
# a single `workload:` section must keep them
PINNED = [
    ({"models": {"tiny": "builtin:tiny"},
      "axes": {"framework": ["llamacpp", "vllm"], "model": ["tiny"], "mode": ["serve", "stream"], "batch_size": [4]},
      "workload": {"seed": 0, "shared_prefix_len": 64, "prefix_groups": 2, "input_lengths": LOGNORMAL}},
     [("f7125e2f36a5766b", "b907191737a39a80"), ("8fc3e868be2c5445", "8a1a7571f5512e89"),
      ("c91b96108f4f2f39", "0d054391f0ce19e7"), ("15e662adb40bcfe0", "f9a24df3abd10279")]),
    ({"models": {"tiny": "builtin:tiny"},
      "axes": {"framework": ["hf"], "model": ["tiny"], "batch_size": [1, 4], "input_len": [300]},
      "workload": {"kind": "sharegpt", "path": "tests/data/sharegpt_multiturn.json", "multi_turn": True}},
     [("b5c362894b9efe71", "335aa07837d381b5"), ("8ab6609f39842ea8", "335aa07837d381b5")]),
]


def named(**changes) -> dict:
    data = {"models": {"tiny": "builtin:tiny"},
            "axes": {"framework": ["llamacpp", "vllm"], "model": ["tiny"], "mode": ["serve", "stream"],
                     "batch_size": [4], "input_len": [512], "output_len": [64], "workload": ["drawn", "chat"]},
            "workloads": {"drawn": {"seed": 0, "input_lengths": LOGNORMAL, "output_lengths": {"kind": "fixed", "value": 16}},
                          "chat": {"kind": "sharegpt", "path": SHAREGPT, "multi_turn": True}}}
    for dotted, value in changes.items():
        node = data
        *parents, last = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return data




@pytest.mark.parametrize("data, pinned", PINNED)
def test_single_workload_section_keeps_its_cell_ids(data, pinned, monkeypatch):
    monkeypatch.chdir(ROOT)
    cells = expand(parse_matrix(data))
    assert [(c.cell_id, c.engine_key) for c in cells] == pinned
    assert all(c.workload is None for c in cells)


def test_workload_axis_expands_and_shares_engines():
    cells = expand(parse_matrix(named()))
    assert len(cells) == 8 and len({c.cell_id for c in cells}) == 8
    by = {(c.framework, c.mode, c.workload): c for c in cells}
    # a drawing workload's row names the distribution's mean; the other takes the axis values (caps)
    assert (by["vllm", "serve", "drawn"].input_len, by["vllm", "serve", "drawn"].output_len) == (448, 16)
    assert (by["vllm", "serve", "chat"].input_len, by["vllm", "serve", "chat"].output_len) == (512, 64)
    # workloads differ in requests only: one engine (one server) per framework and mode
    groups = group(cells)
    assert len(groups) == 4 and all({c.workload for c in g.cells} == {"drawn", "chat"} for g in groups)
    # the axis defaults to every named workload, in order; the name is part of the id (same content, two names)
    same = named(axes__workload=None, workloads__copy={"seed": 0, "input_lengths": LOGNORMAL,
                                                       "output_lengths": {"kind": "fixed", "value": 16}})
    cells2 = expand(parse_matrix(same))
    assert [c.workload for c in cells2[:3]] == ["drawn", "chat", "copy"] and len(cells2) == 12
    assert {c.cell_id for c in cells} <= {c.cell_id for c in cells2}


def test_rules_and_baseline_name_workloads():
    cells = expand(parse_matrix(named(exclude=[{"workload": "chat", "mode": "serve"}],
                                      baseline={"framework": "vllm", "workload": "drawn"})))
    assert sorted({(c.workload, c.mode) for c in cells}) == [("chat", "stream"), ("drawn", "serve"), ("drawn", "stream")]
    assert parse_selector("framework=vllm,workload=chat") == {"framework": "vllm", "workload": "chat"}
    # an include names the workload where the axis has several
    assert problems(named(include=[{"framework": "vllm", "mode": "serve"}])) == [
        "include[0]: missing axis 'workload' (the axis has several values, so the cell is ambiguous)"]


@pytest.mark.parametrize("data, expected", [
    (named(workload={"seed": 1}), ["workloads: give either workload (one workload for every cell) or workloads "
                                   "(named, with the workload axis), not both"]),
    (named(axes__workload=["chat", "chats"]), ["axes.workload[1]: unknown workload 'chats' (defined in "
                                               "workloads: drawn, chat)"]),
    (named(workloads=None), ["axes.workload: the axis names entries of workloads, and the matrix defines none "
                             "(a single workload section needs no axis)"]),
    (named(workloads={}, axes__workload=None), ["workloads: no workload named (give at least one, or use the "
                                                "single workload section)"]),
    (named(exclude=[{"workload": "chats"}]), ["exclude[0].workload: unknown workload 'chats' (defined in "
                                              "workloads: drawn, chat)"]),
    (named(baseline={"workload": "x"}), ["baseline.workload: unknown workload 'x' (defined in workloads: drawn, chat)"]),
    (named(workloads__drawn__seed="a"), ["workloads.drawn.seed: Input should be a valid integer"]),   # strict
    (named(workloads__chat__path="missing.json"), ["workloads.chat.path: missing.json: no such file"]),
    (named(workloads__drawn__prefix_groups=4), ["workloads.drawn.prefix_groups: prefix groups need "
                                                "workloads.drawn.shared_prefix_len > 0 (the tokens each group's "
                                                "requests share)"]),
    # every workload the axis runs draws its input lengths: the input_len axis sweeps nothing
    (named(axes__workload=["drawn"]), ["axes.input_len: every workload draws these lengths "
                                       "(workloads.drawn.input_lengths); leave the axis out",
                                       "axes.output_len: every workload draws these lengths "
                                       "(workloads.drawn.output_lengths); leave the axis out"]),
])
def test_workload_mistakes_name_their_yaml_path(data, expected):
    got = problems(data)
    assert [p[:len(e)] for p, e in zip(got, expected)] == expected and len(got) == len(expected), got


def test_a_single_drawing_section_still_refuses_the_length_axis():
    data = named(workload={"input_lengths": LOGNORMAL}, workloads=None, axes__workload=None)
    assert problems(data) == ["axes.input_len: the workload draws these lengths (workload.input_lengths); leave the "
                              "axis out, or drop workload.input_lengths for a fixed sweep"]


def test_rows_stored_before_named_workloads_read_as_the_single_section(tmp_path):
    """A row of an older run holds the section's JSON in `workload`: it reads as workload null, JSON in
    workload_json, beside a row of today."""
    store = RunStore(tmp_path)
    section = json.dumps({"kind": "synthetic", "seed": 0})
    old = {"run_id": "r", "cell_id": "a", "framework": "hf", "status": "ok", "workload": section}
    new = {"run_id": "r", "cell_id": "b", "framework": "hf", "status": "ok", "workload": "chat",
           "workload_json": section}
    for row in (old, new):
        store.write_cell(row)
    assert cells_file_row(new).column("workload").to_pylist() == ["chat"]
    t = store.read_cells_table(["cell_id", "workload", "workload_json"]).to_pylist()
    assert sorted(t, key=lambda r: r["cell_id"]) == [
        {"cell_id": "a", "workload": None, "workload_json": section},
        {"cell_id": "b", "workload": "chat", "workload_json": section}]
    assert store.read_cells_table(["workload"]).column_names == ["workload"]
