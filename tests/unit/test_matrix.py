"""Matrix parsing, validation errors with YAML paths, and expansion into cells and engine groups."""

import json

import pytest
import yaml

from orchestrator.matrix.cells import expand, group
from orchestrator.matrix.models import MatrixError
from orchestrator.matrix.validate import json_schema, load_matrix, parse_matrix
from tests.helpers import ROOT, problems

BASE = {
    "models": {"tiny": "builtin:tiny", "other": {"source": "/models/other"}},
    "axes": {"framework": ["hf", "llamacpp"], "model": ["tiny"], "quantization": ["fp32"],
             "batch_size": [1, 4], "flags": ["default", "eager"], "input_len": [32], "output_len": [8]},
    "flags": {"hf": {"eager": {"attn_implementation": "eager"}}},
}


def with_(**changes):
    data = json.loads(json.dumps(BASE))
    for dotted, value in changes.items():
        node = data
        *parents, last = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return data


def test_expansion_respects_per_framework_flag_sets():
    cells = expand(parse_matrix(BASE))
    # hf: 2 batch x 2 flag sets; llamacpp defines no 'eager', so only default: 2 batch
    assert sorted((c.framework, c.flags, c.batch_size) for c in cells) == [
        ("hf", "default", 1), ("hf", "default", 4), ("hf", "eager", 1), ("hf", "eager", 4),
        ("llamacpp", "default", 1), ("llamacpp", "default", 4)]
    assert len({c.cell_id for c in cells}) == 6


def test_a_flag_sets_sampling_override_is_a_cell_of_its_own():
    data = with_(measure={"sampling": {"temperature": 0.8, "top_p": 0.95}},
                 flags__hf__narrow={"sampling": {"top_p": 0.5}}, flags__hf__narrower={"sampling": {"top_p": 0.4}},
                 axes__flags=["default", "eager", "narrow", "narrower"])
    m = parse_matrix(data)
    cells = {(c.framework, c.flags, c.batch_size): c for c in expand(m)}
    narrow = cells["hf", "narrow", 1]
    assert narrow.options == {} and m.engine_options("hf", "narrow") == {}    # no engine option reaches the engine
    assert m.sampling_for("hf", "narrow").top_p == 0.5 and m.sampling_for("hf", "narrow").temperature == 0.8
    assert m.sampling_for("hf", "default").top_p == 0.95
    # another override value is another cell; the sets without one keep the ids they had
    assert narrow.cell_id != cells["hf", "narrower", 1].cell_id
    plain = {(c.framework, c.flags, c.batch_size): c.cell_id for c in expand(parse_matrix(
        with_(measure={"sampling": {"temperature": 0.8, "top_p": 0.95}})))}
    assert all(cells[k].cell_id == v for k, v in plain.items())


def test_cell_ids_are_stable_and_engine_keys_shared_across_batch_sizes():
    a, b = expand(parse_matrix(BASE)), expand(parse_matrix(BASE))
    assert [c.cell_id for c in a] == [c.cell_id for c in b]
    groups = group(a)
    assert len(groups) == 3  # hf/default, hf/eager, llamacpp/default
    for g in groups:
        assert [c.batch_size for c in g.cells] == [1, 4]
        assert len({c.engine_key for c in g.cells}) == 1
    # a measurement setting is part of the cell id, not of the engine key
    changed = expand(parse_matrix(with_(measure={"repeats": 5})))
    assert {c.cell_id for c in changed}.isdisjoint({c.cell_id for c in a})
    assert {c.engine_key for c in changed} == {c.engine_key for c in a}


def test_exclude_and_include():
    data = with_(exclude=[{"framework": "hf", "batch_size": [4]}],
                 include=[{"framework": "llamacpp", "quantization": "q4_0", "batch_size": 1, "flags": "default"}])
    cells = expand(parse_matrix(data))
    keys = sorted((c.framework, c.quantization, c.flags, c.batch_size) for c in cells)
    assert keys == [("hf", "fp32", "default", 1), ("hf", "fp32", "eager", 1),
                    ("llamacpp", "fp32", "default", 1), ("llamacpp", "fp32", "default", 4),
                    ("llamacpp", "q4_0", "default", 1)]


def test_serve_cells_expand_over_modes_and_rates():
    data = with_(axes__framework=["llamacpp"], axes__flags=["default"], axes__mode=["offline", "serve"],
                 axes__request_rate=[float("inf"), 8.0],
                 models__remote={"source": "/models/other", "endpoint": "http://127.0.0.1:9/"},
                 axes__model=["tiny", "remote"], exclude=[{"mode": "serve", "request_rate": 8.0, "batch_size": 1}])
    cells = expand(parse_matrix(data))
    got = sorted((c.model, c.mode, c.batch_size, c.request_rate or 0) for c in cells)
    inf = float("inf")
    # an offline cell has no rate (one per batch size); a model with an endpoint makes serve cells only
    assert got == [("remote", "serve", 1, inf), ("remote", "serve", 4, 8.0), ("remote", "serve", 4, inf),
                   ("tiny", "offline", 1, 0), ("tiny", "offline", 4, 0),
                   ("tiny", "serve", 1, inf), ("tiny", "serve", 4, 8.0), ("tiny", "serve", 4, inf)]
    groups = group(cells)
    assert sorted((g.model, g.mode, len(g.cells)) for g in groups) == [
        ("remote", "serve", 3), ("tiny", "offline", 2), ("tiny", "serve", 3)]
    # offline ids do not depend on the serve settings; serve ids do
    other = expand(parse_matrix(data | {"serve": {"requests": 7}}))
    same = {c.cell_id for c in cells if c.mode == "offline"}
    assert same <= {c.cell_id for c in other}
    assert not {c.cell_id for c in cells if c.mode == "serve"} & {c.cell_id for c in other}


def test_unknown_framework_names_index_and_choices():
    got = problems(with_(axes__framework=["hf", "llamacpp", "vlm"]))
    assert got == ["axes.framework[2]: unknown framework 'vlm' (known: hf, vllm, trtllm, lmdeploy, llamacpp, numpy)"]


@pytest.mark.parametrize("data, expected", [
    (with_(axes__model=["tiny", "nope"]), "axes.model[1]: unknown model 'nope' (defined in models: tiny, other)"),
    (with_(axes__quantization=["fp32", "int3"]), "axes.quantization[1]: unknown quantization 'int3'"),
    (with_(axes__batch_size=[1, 0]), "axes.batch_size[1]: Input should be greater than or equal to 1"),
    (with_(axes__flags=["default", "turbo"]), "axes.flags[1]: unknown flag set 'turbo' (defined: default, eager)"),
    (with_(flags__hf__eager={"attn": "eager"}), "flags.hf.eager.attn: unknown key (known options for hf:"),
    (with_(flags__hf__eager={"attn_implementation": "flash"}), "flags.hf.eager.attn_implementation: Input should be 'eager' or 'sdpa'"),
    (with_(flags__vlm={"x": {}}), "flags.vlm: unknown framework 'vlm'"),
    (with_(workload={"kind": "jsonl"}), "workload.path: Field required"),
    (with_(workload={"kind": "csv"}), "workload: Input tag 'csv' found using 'kind' does not match"),
    (with_(measure={"repeats": 0}), "measure.repeats: Value error, expected a number of timed batches from 1 to 100,000, or 'auto'"),
    (with_(measure={"repeats": "many"}), "measure.repeats"),
    (with_(measure={"auto_repeats": {"half_width": 0}}), "measure.auto_repeats.half_width: Input should be greater than 0"),
    (with_(measure={"topk": 5}), "measure.topk: unknown key"),
    (with_(exclude=[{"framwork": "hf"}]), "exclude[0].framwork: unknown axis (known: framework, model,"),
    (with_(include=[{"framework": "hf", "flags": "default"}]), "include[0]: missing axis 'batch_size'"),
    (with_(include=[{"framework": "llamacpp", "batch_size": 1, "flags": "eager"}]),
     "include[0].flags: flag set 'eager' is not defined for llamacpp"),
    (with_(baseline={"framework": "hf", "quantization": "int3"}), "baseline.quantization: unknown quantization 'int3'"),
    (with_(run={"python": {"vlm": "/x"}}), "run.python.vlm: unknown framework 'vlm'"),
    (with_(run={"device": "tpu"}), "run.device: Input should be 'auto', 'cpu' or 'cuda'"),
    (with_(bogus=1), "bogus: unknown key"),
    (with_(axes__mode=["offline", "served"]), "axes.mode[1]: Input should be 'offline', 'serve' or 'stream'"),
    (with_(axes__request_rate=[0]), "axes.request_rate[0]: Input should be greater than 0"),
    (with_(exclude=[{"mode": "online"}]), "exclude[0].mode: unknown mode 'online' (known: offline, serve, stream)"),
    (with_(exclude=[{"request_rate": "fast"}]), "exclude[0].request_rate: expected a positive number of requests/s"),
    (with_(models__other={"source": "/m", "endpoint": "10.0.0.5:8000"}), "models.other.endpoint: Value error, "
     "expected an http:// or https:// URL"),
    (with_(axes__model=["tiny", "other"], models__other={"source": "/m", "endpoint": "http://10.0.0.5:8000"}),
     "models.other.endpoint: a model with an endpoint makes serve cells only, and axes.mode has no serve"),
    (with_(serve={"arrival": "bursty"}), "serve.arrival: Input tag 'bursty' found using 'kind' does not match any of "
     "the expected tags: 'constant', 'poisson', 'gamma', 'ramp'"),
    (with_(serve={"requests": 0}), "serve.requests: Input should be greater than or equal to 1"),
    # a flag set's sampling override: measure.sampling fields, on a run that samples
    (with_(flags__hf__eager={"sampling": {"top_p": 0.9}}), "flags.hf.eager.sampling: overrides measure.sampling, "
     "which is not set"),
    (with_(measure={"sampling": {}}, flags__hf__eager={"sampling": {"top_p": 1.5}}),
     "flags.hf.eager.sampling.top_p: Input should be less than or equal to 1"),
    (with_(measure={"sampling": {}}, flags__hf__eager={"sampling": {"topp": 0.9}}),
     "flags.hf.eager.sampling.topp: unknown key (known: temperature, top_p, top_k, min_p, seeds,"),
    (with_(measure={"sampling": {}}, flags__hf__eager={"sampling": 0.9}), "flags.hf.eager.sampling: expected a "
     "mapping of measure.sampling fields"),
    (with_(measure={"sampling": {"seeds": "auto", "auto_seeds": {"min_seeds": 32, "max_seeds": 16}}}),
     "measure.sampling.auto_seeds: Value error, max_seeds (16) is below min_seeds (32)"),
    (with_(measure={"sampling": {"seeds": 0}}), "measure.sampling.seeds: Value error, expected a number of seeds from 1 to 100,000"),
])
def test_each_kind_of_mistake_names_its_yaml_path(data, expected):
    got = problems(data)
    assert any(p.startswith(expected) for p in got), got


def test_all_mistakes_reported_together(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(with_(axes__framework=["vlm"], axes__model=["nope"])))
    with pytest.raises(MatrixError) as info:
        load_matrix(path)
    assert len(info.value.problems) == 2
    assert str(path) in str(info.value)


def test_yaml_syntax_error_and_non_mapping(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("axes: [unclosed\n")
    with pytest.raises(MatrixError, match=r"\(yaml\)"):
        load_matrix(bad)
    with pytest.raises(MatrixError, match="expected a mapping"):
        parse_matrix(["not", "a", "mapping"])


def test_yaml_tags_are_not_executed(tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text("models: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(MatrixError, match=r"\(yaml\)"):
        load_matrix(path)


def test_json_schema_lists_the_sections():
    schema = json_schema()
    assert {"models", "axes", "flags", "include", "exclude", "workload", "measure", "baseline", "run"} <= set(schema["properties"])


def test_shipped_matrices_validate():

    for path in sorted(ROOT.joinpath("matrices").glob("*.yaml")):
        m, _ = load_matrix(path)
        assert expand(m), path
