"""What `bench run` shows while it runs (orchestrator/execution/progress.py), fed the reports a run's parts
send: plain lines when not a terminal, nothing with --quiet, the running cell named, an ETA from the
estimates; Ray's own log lines go to the run's log (scheduler.ray_log_into), not the terminal."""

import io
import logging

from rich.console import Console
from typer.testing import CliRunner

from adapters.contract.events import PartReport
from orchestrator.cli import app
from orchestrator.execution import runner
from orchestrator.execution.scheduling import scheduler
from orchestrator.execution.progress import RunProgress, cell_label
from orchestrator.matrix.cells import Cell


def cell(fw: str, b: int, flags: str = "default") -> Cell:
    return Cell(fw, "tiny", "fp32", flags, b, 16, 8, {}, cell_id=f"{fw}-{flags}-{b}", engine_key=f"{fw}-{flags}")


CELLS = [cell("hf", 1), cell("hf", 4), cell("llamacpp", 1)]


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def progress(mode: str, terminal: bool = False) -> tuple[RunProgress, io.StringIO, Clock]:
    out, clock = io.StringIO(), Clock()
    console = Console(file=out, force_terminal=terminal, width=120)
    p = RunProgress(console, "smoke", CELLS, mode, now=clock)
    p.planned("hf-default", 10.0, {"hf-default-1": 5.0, "hf-default-4": 5.0})
    p.planned("llamacpp-default", 20.0, {"llamacpp-default-1": 10.0})
    return p, out, clock


def report(part: str, what: str, t: float, cell_id: str | None = None, status: str | None = None) -> PartReport:
    return PartReport(part=part, what=what, cell_id=cell_id, status=status, t=t)


def run_hf_group(p: RunProgress, clock: Clock) -> None:
    """The hf group: loads in 10 s (as estimated), its first cell takes 10 s (twice its estimate)."""
    p.submitted("p1", CELLS[:2], "node-a")
    p.reported(report("p1", "loading", 1000.0))
    clock.t = 1010.0
    p.reported(report("p1", "loaded", 1010.0))
    p.reported(report("p1", "start", 1010.0, "hf-default-1"))
    clock.t = 1020.0
    p.reported(report("p1", "end", 1020.0, "hf-default-1", "ok"))
    p.reported(report("p1", "start", 1020.0, "hf-default-4"))


def test_not_a_terminal_is_one_plain_line_per_finished_cell():
    p, out, clock = progress("plain")
    with p:
        run_hf_group(p, clock)
        assert out.getvalue().splitlines() == ["[1/3] ok          hf/tiny/fp32/default b=1  elapsed 0:00:20  ETA 0:00:50"]
        # the cells' estimates are scaled by what the run measured (10 s over 5 s estimated: x2): 10 s left
        # of hf b=4, then llama.cpp's load (20 s, loads as estimated) and its cell (10 s x 2)
        clock.t = 1030.0
        p.reported(report("p1", "end", 1030.0, "hf-default-4", "failed"))
        p.stored("hf-default-1", "ok")          # the rows arrive: counted once
        p.stored("hf-default-4", "failed")
        p.part_ended("p1")
        p.stored("llamacpp-default-1", "unsupported")   # a row no report announced (the group could not start)
    lines = out.getvalue().splitlines()
    assert [line.split()[:3] for line in lines] == [["[1/3]", "ok", "hf/tiny/fp32/default"],
                                                   ["[2/3]", "failed", "hf/tiny/fp32/default"],
                                                   ["[3/3]", "unsupported", "llamacpp/tiny/fp32/default"]]
    assert "b=4" in lines[1] and lines[2].endswith("ETA 0:00:00")
    assert "\x1b" not in out.getvalue() and "━" not in out.getvalue(), "no bar, no escape codes: lines for a log"


def test_quiet_prints_nothing():
    p, out, clock = progress("quiet")
    with p:
        run_hf_group(p, clock)
        p.stored("hf-default-4", "ok")
        p.stored("llamacpp-default-1", "ok")
    assert out.getvalue() == ""
    assert p.done == 3, "it still counts"


def test_the_mode_follows_the_console_and_quiet():
    assert RunProgress.for_console(Console(file=io.StringIO()), "m", CELLS).mode == "plain"
    assert RunProgress.for_console(Console(file=io.StringIO(), force_terminal=True), "m", CELLS).mode == "live"
    assert RunProgress.for_console(Console(file=io.StringIO(), force_terminal=True), "m", CELLS, quiet=True).mode == "quiet"


def test_live_names_the_running_cell_and_counts_each_cell():
    p, out, clock = progress("live", terminal=True)
    with p:
        run_hf_group(p, clock)
        assert p.done == 1 and p.lines() == ["  running hf/tiny/fp32/default b=4  (0:00:00)"]
        assert round(p.eta()) == 50
        p._bar.refresh()
        screen = out.getvalue()
        assert "1/3" in screen and "running hf/tiny/fp32/default b=4" in screen and "ETA 0:00:50" in screen


def test_loading_and_one_line_per_node_on_a_cluster():
    p, _, clock = progress("quiet")
    p.nodes({"node-a": "10.0.0.1", "node-b": "10.0.0.2", "node-c": "10.0.0.3"})
    p.submitted("p1", CELLS[:2], "node-a")
    p.submitted("p2", CELLS[2:], "node-b")
    p.reported(report("p1", "loading", 1000.0))
    p.reported(report("p2", "loading", 1000.0))
    clock.t = 1003.0
    p.reported(report("p2", "start", 1003.0, "llamacpp-default-1"))
    assert p.lines() == ["  10.0.0.1: loading hf/tiny/fp32/default  (0:00:03)",
                         "  10.0.0.2: running llamacpp/tiny/fp32/default b=1  (0:00:00)",
                         "  10.0.0.3: idle"]
    # two parts at once: the work left over two
    assert p.eta() == (5 + 5 + 10 - 3 + 10 - 0) / 2


def test_cell_labels_name_what_sets_a_cell_apart():
    served = Cell("vllm", "tiny", "fp32", "default", 8, 16, 8, {}, mode="serve", request_rate=2.0, workload="chat")
    assert cell_label(served) == "vllm/tiny/fp32/default b=8 serve 2 req/s chat"
    assert cell_label(cell("hf", 4, "eager")) == "hf/tiny/fp32/eager b=4"


def test_rays_log_lines_go_to_the_run_log_not_the_terminal(tmp_path, capfd):
    ray_logger = logging.getLogger("ray")
    saved = (list(ray_logger.handlers), ray_logger.propagate, ray_logger.level)
    ray_logger.addHandler(logging.StreamHandler())   # what Ray installs when it is imported
    try:
        scheduler.ray_log_into(tmp_path / "a" / "run.log")
        scheduler.ray_log_into(tmp_path / "b" / "run.log")    # a second run in one process: its own file
        logging.getLogger("ray._private.authentication.authentication_token_setup").warning(
            "Token authentication is enabled for this Ray cluster.")
        for h in ray_logger.handlers:
            h.flush()
        assert "Token authentication" in (tmp_path / "b" / "run.log").read_text()
        assert not (tmp_path / "a" / "run.log").exists() or "Token" not in (tmp_path / "a" / "run.log").read_text()
        captured = capfd.readouterr()
        assert "Token" not in captured.err and "Token" not in captured.out
    finally:
        for h in ray_logger.handlers:
            h.close()
        ray_logger.handlers[:] = saved[0]
        ray_logger.propagate, ray_logger.level = saved[1], saved[2]


def test_bench_run_quiet_reaches_the_runner(monkeypatch, tmp_path):
    seen = {}

    class Store:
        root = tmp_path

        def read_cells(self):
            import pandas as pd
            return pd.DataFrame()

    def fake(matrix, run_dir, address, rerun_failed, console=None, history=None, quiet=False):
        seen["quiet"] = quiet
        return Store()

    monkeypatch.setattr(runner, "run_matrix", fake)
    monkeypatch.setattr("orchestrator.cli.running.summary_table", lambda *a, **k: "")
    monkeypatch.setattr("orchestrator.cli.running.print_table", lambda *a, **k: None)
    m = tmp_path / "m.yaml"
    m.write_text("name: m\n")
    for args, want in ((["--quiet"], True), (["-q"], True), ([], False)):
        result = CliRunner().invoke(app, ["run", str(m), *args])
        assert result.exit_code == 0, result.output
        assert seen.pop("quiet") is want


def test_each_framework_is_scaled_by_its_own_measurements_once_it_has_some():
    cells = [cell("hf", 1), cell("hf", 4), cell("llamacpp", 1), cell("llamacpp", 4)]
    clock = Clock()
    p = RunProgress(Console(file=io.StringIO()), "m", cells, "quiet", now=clock)
    p.planned("hf-default", 10.0, {"hf-default-1": 5.0, "hf-default-4": 5.0})
    p.planned("llamacpp-default", 20.0, {"llamacpp-default-1": 10.0, "llamacpp-default-4": 10.0})
    run_hf_group(p, clock)                     # hf: its cells twice their estimates, its load as estimated
    assert p.scale("hf") == (1.0, 2.0) and p.scale("llamacpp") == (1.0, 2.0), "nothing of llama.cpp yet: the run's"
    p.reported(report("p1", "end", 1030.0, "hf-default-4", "ok"))
    p.part_ended("p1")
    p.submitted("p2", cells[2:], "node-a")
    p.reported(report("p2", "loading", 1030.0))
    p.reported(report("p2", "loaded", 1035.0))            # 5 s of 20 estimated: x0.25
    p.reported(report("p2", "start", 1035.0, "llamacpp-default-1"))
    clock.t = 1040.0
    p.reported(report("p2", "end", 1040.0, "llamacpp-default-1", "ok"))   # 5 s of 10: x0.5
    assert p.scale("llamacpp") == (0.25, 0.5) and p.scale("hf") == (1.0, 2.0)
    assert p.scale("vllm") == (15 / 30, 25 / 20), "a framework not measured: every framework's"
    assert p.eta() == 10 * 0.5
