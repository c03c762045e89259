"""The fixtures every test folder shares, and what each folder costs.

- tests/unit: no engine, no Ray, no child process (pure Python, Parquet, DuckDB, the CLI in process
  through typer's CliRunner). Seconds. tests/unit/conftest.py fails a test there that starts a process.
- tests/engines: one engine, in process or in its own child (`python -m adapters.worker`, the vLLM
  environment's interpreter), no Ray.
- tests/e2e: `bench run` or the scheduler on a real local Ray cluster, engine servers, `bench` as a
  child process and any other child process.
- tests/gpu: the engines on a CUDA GPU (skipped without one).

Every test under tests/engines, tests/e2e and tests/gpu is marked `slow` here, by its path, so
`pytest -m "not slow"` (`make test-fast`) is the fast loop; `pytest` runs everything.
What several files share besides fixtures is in tests/helpers.py.
"""

import os
from pathlib import Path

import pytest
import yaml

from tests.helpers import ROOT, SMALL_MATRIX, bench_cmd  # noqa: F401 - also importable from here, as before

TESTS = Path(__file__).resolve().parent
SLOW_FOLDERS = ("engines", "e2e", "gpu")


def pytest_addoption(parser):
    parser.addoption("--allow-missing", action="append", default=[], metavar="ENGINE",
                     help="tests/gpu on a CUDA machine: let ENGINE (hf, vllm, trtllm, lmdeploy) be missing or "
                          "unsupported (its tests skip instead of failing); repeatable")


@pytest.hookimpl(tryfirst=True)   # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        try:
            folder = Path(item.path).resolve().relative_to(TESTS).parts[0]
        except ValueError:
            continue
        if folder in SLOW_FOLDERS:
            item.add_marker(pytest.mark.slow)


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


@pytest.fixture
def write_matrix(tmp_path):
    def write(data: dict, name: str = "matrix.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data))
        return path

    return write
