"""The run store against other processes, on real files: one writer at a time (a second process holding
the run makes compaction refuse, in the API and in `bench compact`), and a writer of large cells SIGKILLed
mid-write leaves every stored cell complete, which a new process resumes and compacts. (The same
stores in one process: unit/test_compaction.py, unit/test_journal.py.)"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.store import journal
from orchestrator.store.compaction import compact
from orchestrator.store.layout import COMMIT_FILE
from orchestrator.store.run_store import RunStore
from tests.helpers import ROOT, small_store


def test_one_writer_at_a_time(tmp_path):
    store = small_store(tmp_path)
    import subprocess

    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.path.insert(0, sys.argv[1]); from orchestrator.store.run_store import RunStore\n"
        "with RunStore(sys.argv[2]).writing():\n    print('held', flush=True); time.sleep(60)"),
        str(ROOT), str(store.root)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RuntimeError, match=f"process {holder.pid} is writing"):
            compact(store)
        res = CliRunner().invoke(app, ["compact", str(store.root)])
        assert res.exit_code == 2 and f"process {holder.pid} is writing" in res.output
        # bench run into the locked dir: one line naming the holder, exit 2, before Ray starts (issue 41)
        run = subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", str(ROOT / "matrices" / "smoke.yaml"),
                              "--run-dir", str(store.root), "--quiet"], capture_output=True, text=True, cwd=ROOT,
                             timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300"})
        lines = [ln for ln in (run.stdout + run.stderr).splitlines() if ln.strip()]
        assert run.returncode == 2 and len(lines) == 1 and f"process {holder.pid} is writing" in lines[0], lines
    finally:
        holder.kill()
        holder.wait()
    with store.writing(), store.writing():  # re-entrant in one process (bench run compacts at its end)
        assert compact(store)["cells_folded"] == 6


WRITER = """
import sys, numpy as np, pyarrow as pa
sys.path.insert(0, sys.argv[1])
from orchestrator.store.run_store import RunStore
from orchestrator.store.schema import LOGPROBS_SCHEMA
store, start, n = RunStore(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rows = 50_000
for i in range(start, start + 12):
    cid = f"c{i:03d}"
    t = pa.table({"run_id": ["r"] * rows, "cell_id": [cid] * rows, "kind": ["prompt"] * rows,
                  "repeat": np.zeros(rows, np.int16), "prompt_index": np.zeros(rows, np.int32),
                  "position": np.arange(rows, dtype=np.int32), "token_id": np.arange(rows, dtype=np.int32),
                  "logprob": np.full(rows, -i, np.float32),
                  "topk_ids": pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(rows * n, np.int32)), n).cast(pa.list_(pa.int32())),
                  "topk_logprobs": pa.FixedSizeListArray.from_arrays(pa.array(np.full(rows * n, -i, np.float32)), n).cast(pa.list_(pa.float32()))},
                 schema=LOGPROBS_SCHEMA)
    store.write_cell({"run_id": "r", "cell_id": cid, "framework": "hf", "status": "ok", "duration_s": float(i)}, t)
    print(i, flush=True)
"""


def test_sigkill_mid_write_leaves_every_stored_cell_complete(tmp_path):
    """A writer of large cells (~5 MB a record) killed with SIGKILL: whatever it left, each cell is
    either stored with all its rows or not stored; a new process resumes and compacts."""
    run = tmp_path / "run"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    proc = subprocess.Popen([sys.executable, str(script), str(ROOT), str(run), "0", "20"], stdout=subprocess.PIPE,
                            text=True)
    done = [int(proc.stdout.readline()) for _ in range(3)]   # three cells stored, the fourth on its way
    time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert done == [0, 1, 2]
    store = RunStore(run)
    status = store.stored_status()
    assert {"c000", "c001", "c002"} <= set(status) and len(status) < 12
    rows = store.read_logprobs(["cell_id", "logprob"]).to_pandas()
    assert rows.groupby("cell_id").size().to_dict() == dict.fromkeys(status, 50_000)   # never a part of a cell
    assert (rows.logprob == -rows.cell_id.str[1:].astype(int)).all()
    # resume: a new process writes the cells not stored (a new journal file), then compaction folds all
    first = len(status)
    subprocess.run([sys.executable, str(script), str(ROOT), str(run), str(first), "20"], check=True,
                   stdout=subprocess.DEVNULL)
    assert len(journal.journal_files(run)) == 2
    compact(store)
    status = store.stored_status()
    assert len(status) == first + 12 and journal.journal_files(run) == []
    cells = store.read_cells().set_index("cell_id")
    assert (cells.duration_s == cells.index.str[1:].astype(float)).all()
    record = json.loads((run / COMMIT_FILE).read_text())
    assert sum(sum(info["rows"]) for info in record["logprobs"].values()) == 50_000 * len(status)


_READER = """
import sys, time, traceback
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from orchestrator.store.run_store import RunStore
from orchestrator.judge.verdicts import judge_run
store, stop, n = RunStore(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
reads = fails = 0
while not stop.exists():
    try:
        if sys.argv[5] == "judge":   # bench compare's reader: several scans by path (DuckDB)
            assert len(judge_run(store.root).cells) == n
        else:
            ids = store.read_cells_table(["cell_id"])["cell_id"].to_pylist()
            lps = store.read_logprobs(["cell_id"]).num_rows
            assert sorted(ids) == sorted(f"c{i}" for i in range(n)) and lps == sum(4 + i for i in range(n)), lps
        reads += 1
        if reads == 1:
            print("reading", flush=True)
    except Exception:
        fails += 1
        traceback.print_exc()
print(reads, fails, flush=True)
"""


def test_readers_racing_compaction_see_the_old_files_or_the_new(tmp_path):
    """20 rounds of a run's cells stored again and compacted while two reader processes read the run
    in a loop (the store's readers; the judge's, as `bench compare`): every read whole (every cell
    once, every logprob row), no error."""
    from tests.helpers import lp, row

    n = 40
    store = RunStore(tmp_path / "run")
    for i in range(n):
        store.write_cell(row(f"c{i}", "hf" if i % 2 else "vllm"), lp(f"c{i}", 4 + i, -float(i)))
    compact(store)
    stop = tmp_path / "stop"
    readers = [subprocess.Popen([sys.executable, "-c", _READER, str(ROOT), str(store.root), str(stop), str(n), kind],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for kind in ("store", "judge")]
    try:
        assert [p.stdout.readline().strip() for p in readers] == ["reading"] * 2   # both read before the rounds
        for r in range(20):
            for i in range(0, n, 3):   # a third of the cells stored again: a journal that the compaction folds
                store.write_cell(row(f"c{i}", "hf" if i % 2 else "vllm"), lp(f"c{i}", 4 + i, -float(r)))
            compact(store)
            time.sleep(0.3)   # rounds a reader's time apart (a judge read scans the run several times)
    finally:
        stop.touch()
        outs = [p.communicate(timeout=120) for p in readers]
    for out, err in outs:
        reads, fails = map(int, out.split())
        assert fails == 0 and reads > 1, (reads, err[-3000:].splitlines()[-3:])
        print(f"{reads} reads, {fails} failures")
