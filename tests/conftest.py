"""The fixtures every test folder shares, and what each folder costs.

- tests/unit: no engine, no Ray, no child process (pure Python, Parquet, DuckDB, the CLI in process
  through typer's CliRunner). Seconds. tests/unit/conftest.py fails a test there that starts a process.
- tests/engines: one engine, in process or in its own child (`python -m adapters.worker`, the vLLM
  environment's interpreter), no Ray.
- tests/e2e: `bench run` or the scheduler on a real local Ray cluster, engine servers, `bench` as a
  child process and any other child process.
- tests/gpu: the engines on a CUDA GPU (skipped without one).

Every test under tests/engines, tests/e2e and tests/gpu is marked `slow` here, by its path (and a few unit tests
at a large cluster's scale mark themselves), so
`pytest -m "not slow"` (`make test-fast`) is the fast loop; `pytest` runs everything.
What several files share besides fixtures is in tests/helpers.py.

No engine process outlives the test module that started it (`no_engine_left`): orphaned vLLM engine cores
once ran on for 20 minutes and stalled the suite. The session is the subreaper of everything it starts
(PR_SET_CHILD_SUBREAPER), so an engine process whose parent died is still found among its descendants,
never confused with another session's on a shared host.
"""

import ctypes
import os
import time
from pathlib import Path

import psutil
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


# what names an engine process on its command line: the engine child, vLLM's engine core and workers
# (their process titles), the engines' servers, the gauge sampler, the engine child's group watchdog
ENGINE_MARKS = ("adapters.worker", "VLLM::", "vllm.entrypoints", "serve_main", "adapters.meters.telemetry",
                "lossless-bench-group-watchdog", "trtllm-serve", "lmdeploy serve")
PR_SET_CHILD_SUBREAPER = 36


def pytest_configure(config):
    try:   # orphans of what the session starts are re-parented to it, not to init: still its descendants
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)
    except (OSError, AttributeError):
        pass


def engine_processes() -> list[psutil.Process]:
    """The session's engine processes still running: its descendants (orphans included) that ENGINE_MARKS name."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(p.cmdline()) or p.name()
        except psutil.Error:
            continue
        if any(mark in cmd for mark in ENGINE_MARKS):
            out.append(p)
    return out


def _reap_zombies() -> None:
    """Wait for the dead children the session adopted (orphans are its children now, and nobody else waits for them)."""
    for p in psutil.Process().children():
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(p.pid, os.WNOHANG)
        except (psutil.Error, ChildProcessError):
            pass


@pytest.fixture(scope="module", autouse=True)
def no_engine_left(request):
    """After each test module (its fixtures torn down first): no engine process the suite started is left.
    One that is (given 15 s to end) is killed, so it cannot stall the modules after it, and fails the module."""
    yield
    deadline = time.monotonic() + 15
    left = engine_processes()
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = engine_processes()
    seen = []
    for p in left:
        try:
            seen.append(f"{p.pid} {' '.join(p.cmdline())[:120]} (parent {p.ppid()}, cwd {p.cwd()})")
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=10)
    _reap_zombies()
    if seen:
        pytest.fail(f"{request.module.__name__} left {len(seen)} engine process(es) running after its tests:\n"
                    + "\n".join(seen), pytrace=False)


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


@pytest.fixture(scope="session")
def served_run(ray_local, tiny_model, cache_dir, tmp_path_factory):
    """One run of tests/helpers.py's served_matrix, read by e2e/test_serve.py (the synthetic workload) and
    e2e/test_chat_run.py (the chat workload): their cells share one vLLM server, one llama.cpp server and the
    offline loads. The "ep" model's server (someone else's: llama.cpp on the fp32 GGUF) runs for the run only;
    whether the run left it running is recorded before it is stopped (no engine outlives a test module)."""
    from types import SimpleNamespace

    from adapters.engines.llamacpp.gguf_convert import gguf_for
    from orchestrator.execution.runner import run_matrix
    from orchestrator.judge.analysis import analyse
    from tests.helpers import served_matrix, start_llamacpp

    d = tmp_path_factory.mktemp("served-run")
    ep = start_llamacpp(str(gguf_for(str(tiny_model), "fp32", cache_dir)[0]), d / "ep.log")
    try:
        (d / "m.yaml").write_text(yaml.safe_dump(served_matrix(ep.url)))
        store = run_matrix(d / "m.yaml", d / "run")
        ep_alive = ep.proc.poll() is None
    finally:
        ep.stop()
    return SimpleNamespace(store=store, cells=store.read_cells(), verdicts=analyse(store.root).set_index("cell_id"),
                           ep_url=ep.url, ep_alive=ep_alive)


@pytest.fixture(scope="session")
def vllm_scripts(tiny_model, cache_dir, tmp_path_factory):
    """Every script registered with tests/helpers.py's vllm_script (engines/test_sampling_engines.py's,
    engines/test_gguf_converter.py's), run at once in .venvs/vllm: name -> its CompletedProcess. All of them
    have ended (their process groups killed) before any test reads one, so no engine outlives a module."""
    import json

    from tests.helpers import VLLM_SCRIPTS, run_engine_scripts

    d = tmp_path_factory.mktemp("vllm-scripts")
    python = ROOT / ".venvs" / "vllm" / "bin" / "python"
    jobs = {}
    for name, build in VLLM_SCRIPTS.items():
        text, cfg = build(tiny_model, cache_dir)
        (d / f"{name}.py").write_text(text)
        jobs[name] = [str(python), str(d / f"{name}.py"), json.dumps(cfg)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return run_engine_scripts(jobs, d, 1500, env=env, cwd=ROOT)
