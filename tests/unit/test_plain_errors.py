"""Failures that are no bug in bench are one `error:` line and an exit code, with what to do (every command,
orchestrator/cli/app.py, through report/console.plain_failure): a full disk (3), a local Ray cluster that did not start (3, after one more try), damaged data (4:
tests/unit/test_journal_damage.py). No traceback.

The full disk is an OSError(ENOSPC) injected at the store's write boundary (a real full file system needs a
mount this suite cannot count on); the cluster that does not start is scheduler._init_local raising what Ray
raises when its startup wait runs out (Ray itself is not started in tests/unit).
"""

import errno

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.execution import reaper
from orchestrator.execution.scheduling import scheduler
from orchestrator.store import compaction, journal, run_store
from orchestrator.store.run_store import RunStore
from tests.helpers import SMALL_MATRIX, lp, row

RAY_TIMEOUT = ("The current node timed out during startup. This could happen because some of the raylet failed to "
               "startup or the GCS has become overloaded.")


def full_disk(path: str = "x"):
    def write(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", path)
    return write


def one_error_line(result, code: int) -> str:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output and result.output.startswith("error: "), result.output
    assert result.output.count("error:") == 1
    return " ".join(result.output.split())


def test_a_full_disk_in_compaction_is_one_line_and_the_journal_stays(tmp_path, monkeypatch):
    store = RunStore(tmp_path / "run")
    for i in range(3):
        store.write_cell(row(f"c{i}"), lp(f"c{i}", 3, -1.0))
    files = journal.journal_files(store.root)
    monkeypatch.setattr(compaction, "_commit", full_disk(str(store.root / "compacted.json")))
    text = one_error_line(CliRunner().invoke(app, ["compact", str(store.root)]), 3)
    assert f"disk full writing {store.root}/compacted.json" in text and "run the same command again" in text
    assert journal.journal_files(store.root) == files and len(store.read_cells()) == 3
    monkeypatch.undo()   # space freed: the same command again
    assert CliRunner().invoke(app, ["compact", str(store.root)]).exit_code == 0
    assert journal.journal_files(store.root) == [] and len(store.read_cells()) == 3


def test_a_full_disk_while_a_cell_is_stored_loses_no_stored_cell_and_the_next_write_goes_on(tmp_path, monkeypatch):
    run_store._JOURNALS.clear()
    store = RunStore(tmp_path / "run")
    store.write_cell(row("a"), lp("a", 3, -1.0))
    monkeypatch.setattr(journal, "_write_all", full_disk())
    with pytest.raises(OSError) as info:
        store.write_cell(row("b"), lp("b", 3, -1.0))
    assert info.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert set(store.stored_status()) == {"a"}
    store.write_cell(row("b"), lp("b", 3, -1.0))   # resumed once space is free: into a new file
    assert set(store.stored_status()) == {"a", "b"} and len(journal.journal_files(store.root)) == 2


@pytest.fixture
def no_cluster(monkeypatch):
    """scheduler.init_ray's local start, less Ray: `_init_local` fails as told; calls counted."""
    calls = {"init": 0, "end": 0, "watch": []}
    outcomes = []

    def init(level="WARNING"):
        calls["init"] += 1
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(scheduler, "_init_local", init)
    monkeypatch.setattr(scheduler.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(scheduler.ray, "shutdown", lambda: None)
    monkeypatch.setattr(reaper, "start", lambda: None)
    monkeypatch.setattr(reaper, "end", lambda *a: calls.__setitem__("end", calls["end"] + 1) or True)
    monkeypatch.setattr(reaper, "watch", lambda d: calls["watch"].append(d))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return calls, outcomes


def test_a_local_cluster_that_misses_rays_startup_wait_is_tried_once_more(no_cluster):
    calls, outcomes = no_cluster

    class Ctx:
        address_info = {"session_dir": "/tmp/ray/session_x"}

    outcomes += [Exception(RAY_TIMEOUT), Ctx()]
    scheduler.init_ray()
    assert calls == {"init": 2, "end": 1, "watch": ["/tmp/ray/session_x"]}, "the failed start's processes are ended"


def test_a_local_cluster_that_does_not_start_twice_is_one_line_and_exit_3(no_cluster, write_matrix, tmp_path):
    calls, outcomes = no_cluster
    outcomes += [Exception(RAY_TIMEOUT), Exception(RAY_TIMEOUT)]
    result = CliRunner().invoke(app, ["run", str(write_matrix(SMALL_MATRIX)), "--run-dir", str(tmp_path / "run")])
    text = one_error_line(result, 3)
    assert "the local Ray cluster did not start, twice (Exception: The current node timed out during startup" in text
    assert "run again when the load is lower" in text and "--address" in text
    assert calls["init"] == 2
