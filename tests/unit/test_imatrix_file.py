"""The importance matrix's parts that need no engine: which graph node feeds which weight (read from a GGUF's
tensors, written here with gguf-py), the file round trip and digest, the array llama.cpp's quantizer reads (ended
by a NULL name), the `imatrix` option refused on a float level, and the preset flag set of the recipe's final run.
Computing one through llama.cpp and quantizing with it: tests/e2e/test_imatrix.py."""

from __future__ import annotations

import numpy as np
import pytest

from adapters import ADAPTERS
from adapters.base import Unsupported
from adapters.contract.specs import ModelFacts
from adapters.engines.llamacpp.imatrix import c_imatrix, imatrix_digest, read_imatrix, weight_inputs, write_imatrix
from orchestrator.explain.sensitivity import matrix_data
from orchestrator.matrix.validate import parse_matrix


def _gguf(path, arch: str, names: dict[str, tuple[int, int]]):
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    for name, (rows, cols) in names.items():
        w.add_tensor(name, np.zeros((rows, cols), np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(8, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_each_weight_gets_the_node_that_is_its_matmuls_input(tmp_path):
    names = {f"blk.1.{k}.weight": (8, 24 if k == "ffn_down" else 8)
             for k in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")}
    path = _gguf(tmp_path / "m.gguf", "qwen2", {**names, "token_embd.weight": (50, 8), "output.weight": (50, 8)})
    arch, inputs = weight_inputs(path)
    assert arch == "qwen2"
    assert inputs == {"blk.1.attn_q.weight": ("attn_norm-1", 8), "blk.1.attn_k.weight": ("attn_norm-1", 8),
                      "blk.1.attn_v.weight": ("attn_norm-1", 8), "blk.1.attn_output.weight": ("kqv_out-1", 8),
                      "blk.1.ffn_gate.weight": ("ffn_norm-1", 8), "blk.1.ffn_up.weight": ("ffn_norm-1", 8),
                      "blk.1.ffn_down.weight": ("ffn_swiglu-1", 24), "output.weight": ("result_norm", 8)}


def test_an_architecture_or_weight_without_known_nodes_is_unsupported(tmp_path):
    with pytest.raises(Unsupported, match="checked for llama, qwen2, qwen3 only; this GGUF is gpt2"):
        weight_inputs(_gguf(tmp_path / "a.gguf", "gpt2", {"blk.0.attn_qkv.weight": (8, 8)}))
    with pytest.raises(Unsupported, match="blk.0.ffn_gate_exps.weight has no known input node"):
        weight_inputs(_gguf(tmp_path / "b.gguf", "llama", {"blk.0.ffn_gate_exps.weight": (8, 8)}))


def test_file_round_trip_digest_and_the_quantizers_array(tmp_path):
    data = {"blk.0.attn_q.weight": np.arange(4, dtype=np.float32), "output.weight": np.ones(3, np.float32)}
    path = write_imatrix(tmp_path / "imatrix.npz", data, {"digest": imatrix_digest(data)})
    back = read_imatrix(path)
    assert set(back) == set(data) and all(np.array_equal(back[k], data[k]) for k in data)
    assert imatrix_digest(back) == imatrix_digest(dict(reversed(list(data.items()))))      # not the order
    assert imatrix_digest({**data, "output.weight": np.full(3, 2, np.float32)}) != imatrix_digest(data)
    arr, _alive = c_imatrix(data)
    assert [arr[i].name for i in range(3)] == [b"blk.0.attn_q.weight", b"output.weight", None]   # NULL-ended
    assert arr[0].size == 4 and [arr[0].data[i] for i in range(4)] == [0.0, 1.0, 2.0, 3.0]
    np.savez(tmp_path / "bad.npz", **{"x.weight": np.array([1.0, np.nan], np.float32)})
    with pytest.raises(Unsupported, match="not finite"):
        read_imatrix(tmp_path / "bad.npz")
    with pytest.raises(Unsupported, match="does not exist"):
        read_imatrix(tmp_path / "none.npz")


def test_imatrix_option_needs_a_quantized_level(tmp_path):
    cls = ADAPTERS["llamacpp"]
    facts = ModelFacts(source=str(tmp_path), kind="dir", config={"model_type": "llama"})
    why = cls.model_problem(facts, "fp32", {"imatrix": "/x/imatrix.npz"}, "cpu")
    assert why and why.startswith("imatrix needs a quantized level")


def test_the_presets_run_under_a_flag_set_of_their_own():
    m = parse_matrix({"name": "t", "models": {"tiny": "builtin:tiny"},
                      "axes": {"framework": ["llamacpp"], "model": ["tiny"], "quantization": ["q4_0"]}}, "t.yaml")
    cell = {"cell_id": "c0ffee", "framework": "llamacpp", "model": "tiny", "quantization": "q4_0", "flags": "default",
            "batch_size": 1, "input_len": 16, "output_len": 4, "mode": "offline"}
    data = matrix_data(m, cell, {}, {"recipe": {"imatrix": "/i.npz"}}, presets=("q8_0", "q4_0"), timed=True,
                       preset_set=("imatrix", {"imatrix": "/i.npz"}))
    assert data["flags"]["llamacpp"]["imatrix"] == {"imatrix": "/i.npz"}
    assert [(i["quantization"], i["flags"]) for i in data["include"]] == [("q4_0", "recipe"), ("q8_0", "imatrix"),
                                                                         ("q4_0", "imatrix")]
    assert data["axes"]["flags"] == ["default"] and data["baseline"]["flags"] == "default"   # the reference: fp32
    parse_matrix(data, "recipe.yaml")
