"""The harness's own costs kept small (benchmarks/overhead.py, benchmarks/fixed_cost.py measure them), each
in processes of its own: the launcher's Arrow conversion imports nothing heavy (in a fresh interpreter and
in a Ray worker), a process imports only the adapters it looks up and the CUDA-only adapters import no
engine, and the memory tracker reads the kernel's peak marks of its process tree, with nothing sampling
while an engine is timed. (The conversion's table itself: unit/test_logprob_rows.py; hf's step clock:
engines/test_hf.py.)"""

import os
import subprocess
import sys
import textwrap
import time

import psutil

from orchestrator.execution.engine_child.rows import read_logprob_rows
from orchestrator.store.schema import LOGPROBS_SCHEMA
from tests.helpers import ROOT, logprob_npz


def test_logprob_table_imports_neither_pandas_nor_pyarrow_compute(tmp_path):
    # the launcher converts a cell's outputs while the child times the next cell: ~1 s of imports there
    logprob_npz(tmp_path / "c.npz")
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from orchestrator.execution.engine_child.rows import read_logprob_rows
        read_logprob_rows("r", "c", Path({str(tmp_path / "c.npz")!r}))
        print(sorted(m for m in ("pandas", "pyarrow.compute") if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_rows_come_back_through_ray_without_pandas_or_pyarrow_compute_in_its_worker(ray_local, tmp_path):
    """The scheduler's task hands a group's rows back as Arrow IPC: Ray's own pickling of a pa.Table
    imports pyarrow.compute and pandas in the Ray worker on first use (0.4-0.6 s of a run's first group)."""
    data = logprob_npz(tmp_path / "c.npz")

    @ray_local.remote
    class GroupWorker:   # its own process: what it has imported is its own
        def imported(self) -> list[str]:
            return sorted(m for m in ("pandas", "pyarrow.compute") if m in sys.modules)

        def pid(self) -> int:
            return os.getpid()

        def rows(self, npz: str):
            import orchestrator.execution.scheduling.scheduler as scheduler
            from orchestrator.execution.engine_child.rows import CellResult

            table = read_logprob_rows("r", "c", npz)
            scheduler.run_group = lambda job: [CellResult({"cell_id": "c"}, table, None, table)]
            return scheduler._run_on_node(None)   # the task's body, a group that made these rows

    worker = GroupWorker.remote()
    pid = ray_local.get(worker.pid.remote())
    try:
        assert ray_local.get(worker.imported.remote()) == []
        (row,) = [r.unpacked() for r in ray_local.get(worker.rows.remote(str(tmp_path / "c.npz")))]
        assert ray_local.get(worker.imported.remote()) == []
    finally:   # gone before the next test: this process's tree is what the memory tracker's test reads
        ray_local.kill(worker)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.05)
    assert row.tasks is None and row.row["node_id"] and row.logprobs.schema.equals(LOGPROBS_SCHEMA)
    assert row.logprobs["topk_ids"].to_pylist() == data["topk_ids"].tolist()
    assert row.samples.equals(row.logprobs)


def test_a_process_imports_only_the_adapters_it_looks_up():
    """The registry imports an adapter's module on first lookup: the engine child of an hf group (and its
    Ray worker's launcher) imports adapters.engines.hf, not the other four frameworks' modules."""
    code = textwrap.dedent("""
        import sys
        import adapters.worker.group, orchestrator.execution.engine_child.supervisor
        from adapters import ADAPTERS
        engines = ("adapters.engines.hf", "adapters.engines.vllm", "adapters.engines.trtllm", "adapters.engines.lmdeploy", "adapters.engines.llamacpp")
        before = [m for m in engines if m in sys.modules]
        names = list(ADAPTERS)
        cls = ADAPTERS["hf"]
        print(before, names, cls.name, [m for m in engines if m in sys.modules])
        print(all(ADAPTERS[n].name == n for n in names), [m for m in engines if m not in sys.modules])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["[] ['hf', 'vllm', 'trtllm', 'lmdeploy', 'llamacpp', 'numpy'] hf ['adapters.engines.hf']", "True []"]


def test_memory_tracker_reads_the_peak_of_its_tree_between_reset_and_read():
    """No thread samples while the engine is timed, yet a child's short-lived peak after the reset is
    seen, and an earlier peak is forgotten by the reset."""
    from adapters.meters.memory import MemoryTracker

    tracker = MemoryTracker().start()
    assert tracker.source == "rss-peak-tree" and not tracker._thread.is_alive()
    blob = bytearray(300 * 2**20)     # a peak of this process before the reset
    del blob
    tracker.reset_peak()
    before, why = tracker.peak()
    assert why is None
    assert before < tracker.sample() + 100 * 2**20, before   # the 300 MiB peak is forgotten
    # a child that peaks at 200 MiB for 0.2 s, then holds 10 MiB: a sampler might miss it, the mark does not
    child = subprocess.Popen([sys.executable, "-c", "import time; x = bytearray(200 * 2**20); time.sleep(0.2); "
                              "del x; print('low', flush=True); time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "low"
        assert tracker.peak()[0] > before + 190 * 2**20
        assert tracker.sample() < before + 100 * 2**20     # what a sample now sees
    finally:
        child.kill()
        child.wait()


def test_adapters_import_no_engine():
    code = ("import sys, adapters\n"
            "from adapters.contract.specs import LoadSpec, ModelSpec\n"
            "from adapters.engines.trtllm import adapter as trtllm\n"
            "from adapters.engines.lmdeploy import adapter as lmdeploy\n"
            "s = LoadSpec(framework='x', model=ModelSpec(name='m', source='/m'), quantization='fp16', device='cuda')\n"
            "trtllm.engine_kwargs(s); lmdeploy.engine_kwargs(s)\n"
            "assert 'tensorrt_llm' not in sys.modules and 'lmdeploy' not in sys.modules, sorted(sys.modules)\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
