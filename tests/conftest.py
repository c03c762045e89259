import os
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def pytest_addoption(parser):
    parser.addoption("--allow-missing", action="append", default=[], metavar="ENGINE",
                     help="tests/gpu on a CUDA machine: let ENGINE (hf, vllm, trtllm, lmdeploy) be missing or "
                          "unsupported (its tests skip instead of failing); repeatable")


@pytest.fixture(scope="session", autouse=True)
def cache_dir(tmp_path_factory):
    """One model cache per test session (the tiny model is built once), unless CI gives one."""
    path = os.environ.get("LOSSLESS_BENCH_CACHE") or str(tmp_path_factory.mktemp("cache"))
    os.environ["LOSSLESS_BENCH_CACHE"] = path
    return Path(path)


@pytest.fixture(scope="session")
def tiny_model(cache_dir) -> Path:
    from orchestrator.inputs.tiny_model import resolve_builtin

    return resolve_builtin("tiny", cache_dir)


@pytest.fixture(scope="session")
def ray_local():
    """A real local Ray cluster, shared by the tests of a session: its own (address="local"), never another
    session's cluster that happens to run on the machine."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    yield ray
    ray.shutdown()


SMALL_MATRIX = {
    "name": "small",
    "models": {"tiny": "builtin:tiny"},
    "axes": {"framework": ["hf"], "model": ["tiny"], "quantization": ["fp32"], "batch_size": [1, 2],
             "input_len": [16], "output_len": [6]},
    "measure": {"warmup": 1, "repeats": 2, "scoring_prompts": 2, "scoring_len": 24, "greedy_tokens": 5,
                "score_repeats": 2, "top_k": 8},
    "run": {"cell_timeout_s": 120, "load_timeout_s": 300},
}


@pytest.fixture
def write_matrix(tmp_path):
    def write(data: dict, name: str = "matrix.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data))
        return path

    return write


def bench_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator.cli", *args]
