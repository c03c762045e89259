"""The harness's own costs kept small (benchmarks/overhead.py, benchmarks/fixed_cost.py measure them):
the launcher's Arrow conversion imports nothing heavy, and the memory tracker reads the kernel's peak
marks of its process tree, with nothing sampling while an engine is timed."""

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pyarrow as pa

from orchestrator.execution.rows import read_logprob_rows
from orchestrator.store.schema import LOGPROBS_SCHEMA


def _npz(path, n=50, k=4, seed=0):
    rng = np.random.default_rng(seed)
    data = {"kind": rng.integers(0, 2, n).astype(np.int8), "repeat": rng.integers(0, 3, n).astype(np.int16),
            "prompt_index": rng.integers(0, 9, n).astype(np.int32), "position": np.arange(n, dtype=np.int32),
            "token_id": rng.integers(0, 500, n).astype(np.int32), "logprob": rng.random(n).astype(np.float32),
            "topk_ids": rng.integers(0, 500, (n, k)).astype(np.int32),
            "topk_logprobs": rng.random((n, k)).astype(np.float32)}
    np.savez(path, **data)
    return data


def test_logprob_table_has_the_schema_and_every_value(tmp_path):
    data = _npz(tmp_path / "c.npz")
    table = read_logprob_rows("run-1", "cell-1", tmp_path / "c.npz")
    table.validate(full=True)
    assert table.schema.equals(LOGPROBS_SCHEMA)
    for name in ("repeat", "prompt_index", "position", "token_id", "logprob", "topk_ids", "topk_logprobs"):
        assert table[name].to_pylist() == data[name].tolist(), name
    assert table["kind"].to_pylist() == ["prompt" if x == 0 else "generation" for x in data["kind"]]
    assert set(table["run_id"].to_pylist()) == {"run-1"} and set(table["cell_id"].to_pylist()) == {"cell-1"}
    # what pyarrow itself builds from the same arrays
    ref = pa.table({"topk_ids": pa.FixedSizeListArray.from_arrays(pa.array(data["topk_ids"].reshape(-1)), 4)
                    .cast(pa.list_(pa.int32()))})
    assert table["topk_ids"].equals(ref["topk_ids"])


def test_logprob_table_imports_neither_pandas_nor_pyarrow_compute(tmp_path):
    # the launcher converts a cell's outputs while the child times the next cell: ~1 s of imports there
    _npz(tmp_path / "c.npz")
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from orchestrator.execution.rows import read_logprob_rows
        read_logprob_rows("r", "c", Path({str(tmp_path / "c.npz")!r}))
        print(sorted(m for m in ("pandas", "pyarrow.compute") if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_rows_come_back_through_ray_without_pandas_or_pyarrow_compute_in_its_worker(ray_local, tmp_path):
    """The scheduler's task hands a group's rows back as Arrow IPC: Ray's own pickling of a pa.Table
    imports pyarrow.compute and pandas in the Ray worker on first use (0.4-0.6 s of a run's first group)."""
    data = _npz(tmp_path / "c.npz")

    @ray_local.remote
    class GroupWorker:   # its own process: what it has imported is its own
        def imported(self) -> list[str]:
            return sorted(m for m in ("pandas", "pyarrow.compute") if m in sys.modules)

        def pid(self) -> int:
            return os.getpid()

        def rows(self, npz: str):
            import orchestrator.execution.scheduler as scheduler
            from orchestrator.execution.rows import CellResult

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
        import adapters.worker.group, orchestrator.execution.supervisor
        from adapters import ADAPTERS
        engines = ("adapters.engines.hf", "adapters.engines.vllm", "adapters.engines.trtllm", "adapters.engines.lmdeploy", "adapters.engines.llamacpp")
        before = [m for m in engines if m in sys.modules]
        names = list(ADAPTERS)
        cls = ADAPTERS["hf"]
        print(before, names, cls.name, [m for m in engines if m in sys.modules])
        print(all(ADAPTERS[n].name == n for n in names), [m for m in engines if m not in sys.modules])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["[] ['hf', 'vllm', 'trtllm', 'lmdeploy', 'llamacpp'] hf ['adapters.engines.hf']", "True []"]


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


def test_hf_step_clock_stamps_each_generated_token_inside_the_call(tiny_model):
    """hf's per-token times come from generate's streamer (one put per step, after the prompt's): one
    stamp per new token, in order, between the call's start and end; with EOS on, as many as the tokens
    up to and including the EOS."""
    from adapters.contract.specs import LoadSpec, ModelSpec
    from adapters.engines.hf import HfAdapter

    adapter = HfAdapter()
    adapter.load(LoadSpec(framework="hf", model=ModelSpec(name="tiny", source=str(tiny_model)), quantization="fp32",
                          options={}, device="cpu"))
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [13] * 7]
    run = adapter.generate(prompts, 9, ignore_eos=True)
    for req in run.requests:
        assert req.output_tokens == len(req.chunk_times) == 9
        assert run.start < req.chunk_times[0] and all(np.diff(req.chunk_times) >= 0) and req.chunk_times[-1] <= run.end
    # the steps' stamps are shared by the batch's requests (a static batch chooses its tokens together)
    assert run.requests[0].chunk_times == run.requests[1].chunk_times
    # with EOS on: the tokens up to the first EOS, one stamp each (the third step's logits pushed to EOS)
    eos = adapter.gen_eos.eos_token_id
    calls = []

    def eos_from_step_3(module, inputs, logits):
        calls.append(1)
        if len(calls) >= 3:
            logits[..., eos] += 1e4
        return logits

    hook = adapter.model.lm_head.register_forward_hook(eos_from_step_3)
    try:
        run = adapter.generate(prompts, 9, ignore_eos=False)
    finally:
        hook.remove()
    assert [(r.output_tokens, len(r.chunk_times)) for r in run.requests] == [(3, 3)] * 3
