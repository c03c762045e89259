"""`bench report` / `ls` / `show` / `export` on a real run; the report opened in a headless Chromium.

The browser checks need Debian's `chromium` (apt-get install -y chromium); without it they skip. (The
Pareto front and the task layer against an older run, without an engine or a browser:
unit/test_report_tasks.py.)
"""

import copy
import csv
import json
import re
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.execution.runner import run_matrix
from orchestrator.report.write import write_report
from tests.helpers import QA_FLIPPED, QA_RIGHT, SMALL_MATRIX, TASK_ITEMS, html_table, md_table, task_run_by_hand

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium (apt-get install -y chromium) to open the report in")


@pytest.fixture(scope="module")
def report_run(ray_local, tmp_path_factory, tiny_model):
    """hf fp32 at batch 1 and 2, hf eager at batch 1, and hf q4_0 (an `unsupported` row)."""
    d = tmp_path_factory.mktemp("report")
    data = copy.deepcopy(SMALL_MATRIX)
    data["name"] = "rep-matrix"
    data["axes"]["flags"] = ["default"]
    data["flags"] = {"hf": {"eager": {"attn_implementation": "eager"}}}
    data["include"] = [{"framework": "hf", "quantization": "fp32", "batch_size": 1, "flags": "eager"},
                       {"framework": "hf", "quantization": "q4_0", "batch_size": 1, "flags": "default"}]
    path = d / "report.yaml"
    path.write_text(yaml.safe_dump(data))
    store = run_matrix(path, d / "results" / "run1")
    cells = store.read_cells()
    assert len(cells) == 4 and (cells.status == "ok").sum() == 3
    return store


@pytest.fixture(scope="module")
def report(report_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("out") / "report.html"
    html_path, md_path = write_report(report_run.root, out)
    return html_path, md_path


def _chromium(tmp: Path, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
           "--virtual-time-budget=10000", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "CONSOLE" in line and ("Uncaught" in line or "Error" in line)]


def _rows(dom: str) -> tuple[list[str], list[list[str]]]:
    """(column keys, data-v of every body row) of the cells table in a dumped DOM."""
    table = re.search(r'<table class="sortable" id="cells">(.*?)</table>', dom, re.S).group(1)
    keys = re.findall(r'<th data-key="([^"]+)"', table)
    body = re.search(r"<tbody>(.*?)</tbody>", table, re.S).group(1)
    rows = [re.findall(r'<td[^>]*data-v="([^"]*)"', tr) for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)]
    return keys, rows


def test_report_files(report_run, report):
    html_path, md_path = report
    text = html_path.read_text()
    assert md_path == html_path.with_suffix(".md") and md_path.exists()
    # self-contained: no script, stylesheet or image fetched from anywhere
    assert not re.findall(r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)\s*=", text, re.I)
    assert text.count("Plotly.newPlot") == 2 and 'id="plot-quality"' in text and 'id="plot-speed"' in text
    # summary: status counts, the unsupported cell with its reason, provenance
    assert "unsupported: 1" in text and "ok: 3" in text
    assert "hf does not run quantization q4_0" in text
    assert "AMD" in text or "Intel" in text or "cpu" in text.lower()
    assert "torch 2.13.0" in text  # the cells' engine-side versions
    assert "Sessions" in text and "report.yaml" not in text  # no absolute paths of the matrix leak in
    # no tasks section in the matrix: the task panel says so, and still shows perplexity per cell
    assert "No task rows: the matrix had no tasks section" in text and 'id="ppl"' in text
    assert "updatemenus" not in _figure(text, "plot-quality")[1]  # KL is the only quality axis: no menu
    md = md_path.read_text()
    assert "### Tasks\n\nNo task rows: the matrix had no tasks section" in md
    assert "4 cells: 3 ok, 1 unsupported" in md
    assert md.count("\n| hf | tiny |") == 4
    assert "identical" in md and "1.00x" in md


@needs_chromium
def test_report_draws_in_chromium(report, tmp_path):
    html_path, _ = report
    res = _chromium(tmp_path, "--dump-dom", html_path.as_uri())
    assert res.returncode == 0, res.stderr[-2000:]
    dom = res.stdout
    assert not _console_errors(res.stderr), _console_errors(res.stderr)
    assert not re.search(r"<html[^>]*data-report-errors", dom)
    assert re.search(r'<body[^>]*data-plots="2"', dom), "both plots should have drawn"
    assert dom.count('class="main-svg"') >= 4  # plotly draws two layered svgs per plot
    # a scatter point per placed cell: 3 ok cells in the quality plot (plus the frontier's markers)
    quality = dom[dom.index('id="plot-quality"'):dom.index('id="plot-speed"')]
    assert len(re.findall(r'class="point"', quality)) >= 3
    assert len(re.findall(r'class="point"', dom[dom.index('id="plot-speed"'):])) >= 3 * 3  # 3 subplots
    keys, rows = _rows(dom)
    assert len(rows) == 4 and {"verdict", "noise-kl", "kl", "speedup", "tok-s"} <= set(keys)
    assert keys.index("noise-kl") == keys.index("kl") + 1  # the noise floor sits next to the metric

    # the sort script: #sort=-tok-s opens the table sorted by output tokens/s, largest first
    res = _chromium(tmp_path, "--dump-dom", html_path.as_uri() + "#sort=-tok-s")
    keys, rows = _rows(res.stdout)
    col = keys.index("tok-s")
    values = [r[col] for r in rows]
    numbers = [float(v) for v in values if v]
    assert numbers == sorted(numbers, reverse=True) and values[-1] == ""  # blanks (the unsupported cell) last
    assert 'aria-sort="descending"' in res.stdout


@needs_chromium
def test_report_screenshot(report, tmp_path):
    html_path, _ = report
    png = tmp_path / "report.png"
    res = _chromium(tmp_path, "--hide-scrollbars", "--window-size=1400,2000", f"--screenshot={png}",
                    html_path.as_uri())
    assert res.returncode == 0 and png.exists(), res.stderr[-2000:]
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", head[16:24]) == (1400, 2000)
    # a blank 1400x2000 page compresses to a few kB; text and two plots to far more
    assert png.stat().st_size > 60_000


@needs_chromium
def test_script_errors_are_caught(report, tmp_path):
    """The checks above would see a broken page: an error shows as a banner and an attribute."""
    html_path, _ = report
    text = html_path.read_text()
    i = text.rindex("<script>")
    bad = tmp_path / "bad.html"
    bad.write_text(text[:i] + "<script>notDefinedAnywhere();</script>" + text[i:])
    res = _chromium(tmp_path, "--dump-dom", bad.as_uri())
    assert re.search(r'<html[^>]*data-report-errors="[^"]*notDefinedAnywhere', res.stdout)
    assert _console_errors(res.stderr)


def test_ls_show_export(report_run, tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["ls", str(report_run.root.parent)])
    assert res.exit_code == 0, res.output
    assert "run1" in res.output and "rep-matrix" in res.output and "3/4" in res.output

    res = runner.invoke(app, ["show", str(report_run.root), "--wide"])
    assert res.exit_code == 0, res.output
    assert len(re.findall(r"^│ hf +│ tiny +│", res.output, re.M)) == 4 and "unsupported" in res.output

    cells = report_run.read_cells()
    lp_rows = len(pd.read_parquet(report_run.root / "logprobs"))
    res = runner.invoke(app, ["export", str(report_run.root), "--format", "csv", "-o", str(tmp_path / "csv"), "--logprobs"])
    assert res.exit_code == 0, res.output
    with open(tmp_path / "csv" / "cells.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(cells) == 4
    assert {r["cell_id"] for r in rows} == set(cells.cell_id)
    ok = next(r for r in rows if r["status"] == "ok")
    assert len(json.loads(ok["ttft_ms"])) == int(ok["requests"])  # list columns as JSON arrays
    assert "hf does not run quantization q4_0" in next(r["reason"] for r in rows if r["status"] == "unsupported")
    assert len(pd.read_csv(tmp_path / "csv" / "logprobs.csv")) == lp_rows

    res = runner.invoke(app, ["export", str(report_run.root), "--format", "jsonl", "-o", str(tmp_path / "jsonl"), "--logprobs"])
    assert res.exit_code == 0, res.output
    objs = [json.loads(line) for line in (tmp_path / "jsonl" / "cells.jsonl").read_text().splitlines()]
    assert len(objs) == 4 and all(o["framework"] == "hf" for o in objs)
    assert next(o for o in objs if o["status"] == "unsupported")["ttft_ms_p50"] is None
    lp = [json.loads(line) for line in (tmp_path / "jsonl" / "logprobs.jsonl").read_text().splitlines()]
    assert len(lp) == lp_rows and isinstance(lp[0]["topk_ids"], list)

    res = runner.invoke(app, ["export", str(report_run.root), "--format", "xml"])
    assert res.exit_code == 2


def test_report_cli(report_run):
    res = CliRunner().invoke(app, ["report", str(report_run.root)])
    assert res.exit_code == 0, res.output
    assert (report_run.root / "report.html").exists() and (report_run.root / "report.md").exists()


def test_large_run_report_is_aggregated_and_capped(tmp_path, monkeypatch):
    """A run with more cells than a page holds (caps lowered here to 100 for a 600-cell run):
    the quality plot becomes a density plus the Pareto frontier, the speed plot keeps the fastest
    configs, the cells table and report.md are capped, the configs table counts every cell, the
    cells not ok are grouped, and the page says so; it still draws in Chromium."""
    import importlib.util
    import sys

    from orchestrator.report import data as rep
    from orchestrator.store.compaction import compact
    from orchestrator.store.run_store import RunStore
    from tests.helpers import ROOT

    spec = importlib.util.spec_from_file_location("analysis_at_scale", ROOT / "benchmarks" / "analysis_at_scale.py")
    scale = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("analysis_at_scale", scale)
    spec.loader.exec_module(scale)
    run = tmp_path / "big"
    scale.generate(run, 600, 120_000, seed=1)
    compact(RunStore(run))
    for name, cap in (("MAX_POINTS", 100), ("MAX_SERIES", 5), ("MAX_TABLE_CELLS", 100), ("MAX_LISTED", 3)):
        monkeypatch.setattr(rep, name, cap)
    html_path, md_path = write_report(run)
    text = html_path.read_text()
    assert "600 cells, more than one page can hold: the table shows 100 of them" in text
    assert "cells are too many to draw one by one" in text and '"type":"heatmap"' in text
    assert "Showing the 5 of" in text and "grouped by status and the first line of the reason" in text
    body = re.search(r'<table class="sortable" id="cells">.*?<tbody>(.*?)</tbody>', text, re.S).group(1)
    assert body.count("<tr") == 100
    configs = re.search(r'<table class="sortable" id="configs">.*?<tbody>(.*?)</tbody>', text, re.S).group(1)
    counted = [int(x.replace(",", "")) for x in re.findall(r'<tr><td class="" data-v="[^"]*">[^<]*</td>'
                                                            r'<td class="n" data-v="(\d+)"', configs)]
    assert sum(counted) == 600  # every cell is in the engine-config table
    md = md_path.read_text()
    assert md.count("\n| ") == 100 + 1 and "the table shows 100" in md  # header + 100 rows
    if CHROMIUM:
        res = _chromium(tmp_path, "--dump-dom", html_path.as_uri())
        assert res.returncode == 0 and not _console_errors(res.stderr), res.stderr[-2000:]
        assert re.search(r'<body[^>]*data-plots="2"', res.stdout)


# ------------------------------------------------------------------ bench report NEW --against OLD

@pytest.fixture(scope="module")
def rerun(report_run):
    """The report matrix run again, in another run directory: every cell pairs with one of run1."""
    return run_matrix(report_run.root.parent.parent / "report.yaml", report_run.root.parent / "run2")


@pytest.fixture(scope="module")
def batch1_run(report_run, tmp_path_factory):
    """hf fp32 default at batch 1 alone: one cell pairs with run1, run1's other three are in OLD only."""
    data = copy.deepcopy(SMALL_MATRIX)
    data["name"] = "rep-batch1"
    data["axes"]["batch_size"] = [1]
    data["axes"]["flags"] = ["default"]
    path = tmp_path_factory.mktemp("batch1") / "batch1.yaml"
    path.write_text(yaml.safe_dump(data))
    return run_matrix(path, report_run.root.parent / "batch1")


def _figure(text: str, div: str) -> tuple[list, dict]:
    """(traces, layout) of a plot as the page hands them to Plotly.newPlot."""
    m = re.search(r'Plotly\.newPlot\(\s*"' + div + r'",\s*(\[.*?\]),\s*(\{.*?\})\s*,\s*\{"displaylogo', text, re.S)
    return json.loads(m.group(1)), json.loads(m.group(2))


def _values(v) -> list[float]:
    """A plotly array as the page holds it: a list, or base64 of a typed array (plotly >= 6)."""
    if isinstance(v, dict):
        import base64

        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"])).tolist()
    return list(v)


def _against_rows(text: str) -> list[dict[str, str]]:
    """key -> data-v of every body row of the page's against table (the row's tooltip as 'title')."""
    table = re.search(r'<table class="sortable" id="against-cells">(.*?)</table>', text, re.S).group(1)
    keys = re.findall(r'<th data-key="([^"]+)"', table)
    body = re.search(r"<tbody>(.*?)</tbody>", table, re.S).group(1)
    return [dict(zip(keys, re.findall(r'<td[^>]*data-v="([^"]*)"', tr)), title=title)
            for title, tr in re.findall(r'<tr title="([^"]*)">(.*?)</tr>', body, re.S)]


def test_report_against(report_run, rerun, tmp_path):
    """`bench report RUN2 --against RUN1`: the quality plot draws each config's move from RUN1 to RUN2
    as an arrow, from its point in RUN1 to its point in RUN2 (each against its own run's baseline);
    a section and report.md pair every cell with its ratios, calls and what changed."""
    from orchestrator.judge.analysis import analyse

    out = tmp_path / "vs.html"
    res = CliRunner().invoke(app, ["report", str(rerun.root), "--against", str(report_run.root), "-o", str(out)])
    assert res.exit_code == 0, res.output
    text, md = out.read_text(), out.with_suffix(".md").read_text()
    assert '<h2 id="against">Against run1</h2>' in text
    assert "4 pair(s)" in text and "only in" not in text.split('<h2 id="against">')[1].split("</p>")[0]

    cells = set(rerun.read_cells().cell_id)
    rows = _against_rows(text)
    assert len(rows) == 4
    # ids are stable across runs: every cell pairs with its namesake in run1
    pairs = {re.search(r"^cell (\w+) · in run1: cell (\w+)$", r["title"]).groups() for r in rows}
    assert pairs == {(c, c) for c in cells}
    assert sorted(r["vs-config"] for r in rows) == ["hf/tiny/fp32/default"] * 2 + ["hf/tiny/fp32/eager",
                                                                                   "hf/tiny/q4_0/default"]
    ok = [r for r in rows if r["vs-verdict"] != str(VERDICT_RANK["n/a"])]
    assert len(ok) == 3
    for r in ok:  # the same engine on the same model: lossless against run1, and throughput ratios with a call
        assert int(r["vs-verdict"]) <= VERDICT_RANK["lossless"]
        assert float(r["vs-tok_s"]) > 0 and r["vs-tok_s-call"] in ("faster", "slower", "no difference",
                                                                   "not distinguishable", "cannot judge")
        assert float(r["vs-ttft_p99"]) > 0 and float(r["vs-tpot_p50"]) > 0 and float(r["vs-mem"]) > 0
        assert r["vs-changed"]  # "nothing recorded changed", or the provenance diff
    unsupported = next(r for r in rows if r["vs-config"] == "hf/tiny/q4_0/default")
    assert unsupported["vs-tok_s"] == "" and "unsupported" in unsupported["vs-reason"]

    # the arrows: tail at the config's point in run1, head at its point in run2 (log10 on log axes)
    new, old = analyse(rerun.root).set_index("cell_id"), analyse(report_run.root).set_index("cell_id")
    traces, layout = _figure(text, "plot-quality")
    arrows = [a for a in layout.get("annotations", []) if a.get("showarrow") and a.get("arrowhead")]
    placed = [c for c in cells if all(np.isfinite([new.speedup[c], new.kl_mean[c], old.speedup[c], old.kl_mean[c]]))]
    assert len(placed) == 3
    moved = [c for c in placed if (new.speedup[c], new.kl_mean[c]) != (old.speedup[c], old.kl_mean[c])]
    assert moved and len(arrows) == len(moved)   # a baseline cell stays at 1x, KL 0 in both runs: no arrow
    positive = [k for k in [*new.kl_mean, *old.kl_mean] if k > 0]
    for c in moved:
        a = next(a for a in arrows if abs(a["x"] - np.log10(new.speedup[c])) < 1e-5)
        assert (a["xref"], a["yref"], a["axref"], a["ayref"]) == ("x", "y", "x", "y")
        assert a["ax"] == pytest.approx(np.log10(old.speedup[c]), abs=1e-5)
        for y, kl in ((a["y"], new.kl_mean[c]), (a["ay"], old.kl_mean[c])):
            if kl > 0:
                assert y == pytest.approx(np.log10(kl), abs=1e-5)
            else:  # KL 0 is drawn at the axis floor, below every positive KL
                assert y < np.log10(min(positive, default=1e-12))
    tails = next(t for t in traces if t.get("name", "").startswith("in run1"))
    assert sorted(_values(tails["x"])) == pytest.approx(sorted(old.speedup[c] for c in moved))
    assert f"{len(placed) - len(moved)} at the same point in both runs" in text or len(placed) == len(moved)

    # report.md: the same table, one row per pair
    md_rows = md_table(md, "### Against run1")
    assert len(md_rows) == 4 and all(len(r) == 11 for r in md_rows)
    assert sorted(r[0] for r in md_rows) == sorted(r["vs-config"] for r in rows)
    calls = "faster|slower|no difference|not distinguishable|cannot judge"
    assert all(re.match(rf"[\d.e+-]+x \[[\d.e+-]+, [\d.e+-]+\] ({calls})$", r[5])
               for r in md_rows if r[2] != "n/a")
    assert md.count("\n| hf | tiny |") == 4  # the run's own table is still there

    # the page still draws, with the arrows, and nothing throws
    if CHROMIUM:
        res = _chromium(tmp_path, "--dump-dom", out.as_uri())
        assert res.returncode == 0 and not _console_errors(res.stderr), res.stderr[-2000:]
        assert re.search(r'<body[^>]*data-plots="2"', res.stdout)
        quality = res.stdout[res.stdout.index('id="plot-quality"'):res.stdout.index('id="plot-speed"')]
        # plotly.js draws no arrow whose head lies inside its (empty) label's box at the tail: a move of a few
        # pixels; every move longer than 3% of an axis is drawn
        # the y axis spans at least the 1x line's: from the KL floor to 3x max(KL, 0.1) (figures._kl_view)
        y_span = np.log10(max(max(positive, default=0.0), 0.1) * 3) - (np.floor(np.log10(min(positive, default=1e-11))) - 1)
        x_span = layout["xaxis"]["range"][1] - layout["xaxis"]["range"][0]
        long_moves = [a for a in arrows if max(abs(a["x"] - a["ax"]) / x_span, abs(a["y"] - a["ay"]) / y_span) > 0.03]
        assert len(long_moves) <= quality.count('class="annotation-arrow-g"') <= len(moved)

    # without --against the page has none of it
    plain, plain_md = write_report(rerun.root, tmp_path / "plain.html")
    text = plain.read_text()
    assert 'id="against"' not in text and "annotations" not in json.dumps(_figure(text, "plot-quality")[1])
    assert "Against" not in plain_md.read_text()


VERDICT_RANK = {"identical": 0, "lossless": 1, "near-lossless": 2, "lossy": 3, "n/a": 4}


def test_report_against_cells_in_one_run(report_run, batch1_run, tmp_path):
    """NEW with one cell against run1's four: one pair, and run1's other cells listed as only in OLD
    (in the table, and under the plot as configs without an arrow)."""
    html_path, md_path = write_report(batch1_run.root, tmp_path / "one.html", against=report_run.root)
    text = html_path.read_text()
    rows = _against_rows(text)
    assert len(rows) == 4
    only_old = [r for r in rows if r["vs-reason"].startswith("only in OLD")]
    assert len(only_old) == 3 and all(r["vs-tok_s"] == "" for r in only_old)
    assert "1 pair(s)" in text and "3 only in run1" in text
    no_arrow = re.search(r"No arrow from run1: (.*?)</p>", text).group(1)
    for label in ("hf/tiny/fp32/default batch 2", "hf/tiny/fp32/eager batch 1", "hf/tiny/q4_0/default batch 1"):
        assert f"{label} (only in run1)" in no_arrow
    md_rows = md_table(md_path.read_text(), "### Against run1")
    assert len(md_rows) == 4 and sum(r[9].startswith("only in OLD") for r in md_rows) == 3


def test_report_against_usage_errors(report_run, rerun):
    res = CliRunner().invoke(app, ["report", str(report_run.root), "--match", "framework,batch_size"])
    assert res.exit_code == 2 and "--against" in res.output
    # a --match that does not pair one cell to one: a usage error, and no report written
    res = CliRunner().invoke(app, ["report", str(rerun.root), "--against", str(report_run.root), "--match", "framework",
                                   "-o", str(rerun.root / "unpaired.html")])
    assert res.exit_code == 2 and "share" in res.output and not (rerun.root / "unpaired.html").exists()


def test_report_against_when_the_comparison_fails(report_run, rerun, tmp_path, monkeypatch):
    """compare_runs failing (say, OLD's logprobs unreadable) leaves a banner in the section; the rest
    of the report, and the arrows (paired by cell id), still stand."""
    import orchestrator.judge.cross_run

    def broken(*args, **kwargs):
        raise RuntimeError("OLD's logprobs are unreadable\nsecond line")

    monkeypatch.setattr(orchestrator.judge.cross_run, "compare_runs", broken)
    html_path, md_path = write_report(rerun.root, tmp_path / "r.html", against=report_run.root)
    text = html_path.read_text()
    assert "could not be compared with run1: RuntimeError: OLD&#x27;s logprobs are unreadable</div>" in text
    assert 'id="against-cells"' not in text and "No cells to pair." in text
    assert [a for a in _figure(text, "plot-quality")[1].get("annotations", []) if a.get("arrowhead")]
    assert "> This run could not be compared with run1: RuntimeError" in md_path.read_text()


# ------------------------------------------------------------------ the task layer

@pytest.fixture(scope="module")
def task_run(tmp_path_factory) -> Path:
    return task_run_by_hand(tmp_path_factory.mktemp("tasks") / "new", QA_FLIPPED)


def test_report_task_layer(task_run, tmp_path):
    """A cell that flips 20 of 111 qa items right -> wrong: the task panel shows it regressed (McNemar
    exact, change -0.180 with its CI), per task a line with n and the cells per verdict, the task it
    did not run as n/a with the reason, perplexity per cell; the quality plot has a menu whose choices
    are KL and each task's score, and on a task's axis the frontier maximises both."""
    html_path, md_path = write_report(task_run, tmp_path / "tasks.html")
    text, md = html_path.read_text(), md_path.read_text()

    assert '<h2 id="tasks">Task layer</h2>' in text and 'id="no-tasks"' not in text
    assert "<p>exact_match, n=111 items; 3 cell(s): 1 regressed, 2 no change.</p>" in text
    qa = html_table(text, "task-0")   # tasks in name order: qa, summ
    assert [r["task-0-config"][1] for r in qa] == ["vllm/tiny/q4_0/default", "hf/tiny/fp32/default",
                                                   "vllm/tiny/fp32/default"]   # the regression first
    bad = qa[0]
    assert bad["task-0-verdict"][1] == "regressed" and bad["task-0-test"][1] == "McNemar exact"
    assert float(bad["task-0-p"][0]) == pytest.approx(2 * 0.5 ** QA_FLIPPED)
    assert bad["task-0-change"][1].startswith(f"{-QA_FLIPPED / TASK_ITEMS:+.3f} [")
    assert bad["task-0-score"][1].startswith(f"{(QA_RIGHT - QA_FLIPPED) / TASK_ITEMS:.3f} [")
    assert bad["task-0-base"][1] == f"{QA_RIGHT / TASK_ITEMS:.3f}"
    assert bad["task-0-moved"][1] == f"{QA_FLIPPED} worse / 0 better of {TASK_ITEMS}"
    assert re.search(r'style="color:#d73027">regressed</td>', text)   # coloured
    assert all(r["task-0-verdict"][1] == "no change" for r in qa[1:])
    summ = html_table(text, "task-1")
    na = next(r for r in summ if r["task-1-config"][1] == "vllm/tiny/q4_0/default")
    assert na["task-1-verdict"][1] == "n/a" and "lm-eval is not installed" in na["task-1-reason"][1]
    assert {r["task-1-test"][1] for r in summ if r is not na} == {"paired bootstrap"}
    # the cells table carries each cell's worst task verdict; perplexity is one more task-layer figure
    assert sorted(r["tasks"][1] for r in html_table(text, "cells")) == ["no change", "no change", "regressed"]
    ppl = html_table(text, "ppl")
    assert len(ppl) == 3 and sum(float(r["ppl-rel"][0]) != 0 for r in ppl) == 1

    # the quality axis: KL or a task's score, through a plotly dropdown
    traces, layout = _figure(text, "plot-quality")
    buttons = layout["updatemenus"][0]["buttons"]
    assert [b["label"] for b in buttons] == ["quality: KL (logit layer)", "quality: qa score", "quality: summ score"]
    kl, qa_view = buttons[0]["args"], buttons[1]["args"]
    assert kl[1]["yaxis.type"] == "log" and qa_view[1]["yaxis.type"] == "linear"
    assert "qa: exact_match" in qa_view[1]["yaxis.title.text"]
    shown = [t for t, on in zip(traces, qa_view[0]["visible"]) if on]
    assert all(t.get("visible") is False for t in shown)   # the KL view is the one drawn first
    regressed = next(t for t in shown if t["name"] == "qa: regressed")
    assert _values(regressed["x"]) == pytest.approx([3.0]) and \
        _values(regressed["y"]) == pytest.approx([(QA_RIGHT - QA_FLIPPED) / TASK_ITEMS])
    front = next(t for t in shown if t["name"] == "Pareto frontier")
    assert _values(front["x"]) == pytest.approx([1.5, 3.0])   # higher score is better: 1.5x is on it, 1x is not
    kl_front = next(t for t, on in zip(traces, kl[0]["visible"]) if on and t["name"] == "Pareto frontier")
    assert _values(kl_front["x"]) == pytest.approx([1.5, 3.0])
    assert "Quality axis (the menu above the plot): KL (logit layer), qa score, summ score." in text

    # report.md: the task section, one compact table
    rows = md_table(md, "### Tasks")
    assert len(rows) == 6 and all(len(r) == 12 for r in rows)   # qa: 3 cells, summ: 3
    bad = next(r for r in rows if r[0] == "qa" and r[1] == "vllm/tiny/q4_0/default")
    assert bad[-1] == "**regressed**" and bad[6].startswith("-0.180 [") and bad[8] == "McNemar exact"
    assert "- **qa**: exact_match, n=111 items; 3 cell(s): 1 regressed, 2 no change" in md
    assert "Tasks: 1 regressed, 2 no change." in md

    if CHROMIUM:  # the page draws, and the menu's qa choice draws the qa view
        i = text.rindex("<script>")
        switch = ("<script>var gd = document.getElementById('plot-quality'), b = gd.layout.updatemenus[0].buttons[1];"
                  "Plotly.update(gd, b.args[0], b.args[1]).then(function () { document.body.setAttribute("
                  "'data-switched', gd.querySelectorAll('.scatterlayer .point').length + ' ' + "
                  "gd.querySelector('.ytitle').textContent); });</script>")
        page = tmp_path / "switched.html"
        page.write_text(text[:i] + switch + text[i:])
        res = _chromium(tmp_path, "--dump-dom", page.as_uri())
        assert res.returncode == 0 and not _console_errors(res.stderr), res.stderr[-2000:]
        assert not re.search(r"<html[^>]*data-report-errors", res.stdout)
        assert re.search(r'<body[^>]*data-plots="2"', res.stdout) and "updatemenu" in res.stdout
        m = re.search(r'data-switched="(\d+) ([^"]*)"', res.stdout)
        assert m, "the qa view should have drawn"
        assert int(m.group(1)) >= 3 and m.group(2).startswith("qa: exact_match")


def _serving_run(root: Path) -> Path:
    """A run made by hand of served cells of two named workloads: vLLM with its telemetry (prefix-cache hits
    and queries, preemptions, KV-cache and queue maxima; energy null with the reason), llama.cpp with every
    figure null and its reasons, and vLLM's SLO search of the prefix workload with three probes."""
    from orchestrator.store.run_store import RunStore

    store = RunStore(root)
    store.write_manifest({"run_id": root.name, "matrix": {
        "name": "serving", "baseline": {"framework": "vllm", "workload": "prefix"}, "tolerances": {},
        "workloads": {"prefix": {"kind": "synthetic", "shared_prefix_len": 64, "prefix_groups": 2},
                      "chat": {"kind": "sharegpt", "path": "chats.json"}}}})
    no_energy = {"energy_j": "no RAPL zone is readable", "energy_j_per_token": "no RAPL zone is readable"}
    base = dict(run_id=root.name, model="tiny", quantization="fp32", flags="default", batch_size=4, input_len=256,
                output_len=16, mode="serve", request_rate=float("inf"), load="closed", status="ok", peak_mem_bytes=1000,
                workload_json="{}")   # as the launcher stores it (a row without it is read as one of before workloads)
    rows = [dict(base, cell_id="v-prefix", framework="vllm", engine_key="v", workload="prefix", ttft_ms_p50=20.0,
                 ttft_ms_p99=41.5, output_tok_s=500.0, prefix_cache_queries=1024, prefix_cache_hits=384,
                 prefix_cache_hit_rate=0.375, preemptions=0, kv_cache_usage_max=0.125, requests_waiting_max=3,
                 gauge_samples=5, missing=json.dumps(no_energy)),
            dict(base, cell_id="v-chat", framework="vllm", engine_key="v", workload="chat", ttft_ms_p50=30.0,
                 ttft_ms_p99=55.0, output_tok_s=300.0, prefix_cache_queries=800, prefix_cache_hits=600,
                 prefix_cache_hit_rate=0.75, preemptions=2, kv_cache_usage_max=0.25, requests_waiting_max=0,
                 gauge_samples=4, energy_j=12.5, energy_j_per_token=0.05, energy_source="rapl: package-0"),
            dict(base, cell_id="l-prefix", framework="llamacpp", engine_key="l", workload="prefix", ttft_ms_p50=90.0,
                 ttft_ms_p99=200.0, output_tok_s=150.0, missing=json.dumps(no_energy | dict.fromkeys(
                     ("prefix_cache_hit_rate", "preemptions", "kv_cache_usage_max", "requests_waiting_max"),
                     "llama.cpp's server exports no such metric")))]
    search = dict(base, framework="vllm", engine_key="v", workload="prefix", request_rate=None, load="search rate",
                  search_id="s", search_variable="rate",
                  search_slos=json.dumps({"ttft_p99_ms": 300.0, "judge": "point", "variable": "rate"}))
    rows.append(dict(search, cell_id="s", ttft_ms_p50=25.0, ttft_ms_p99=280.0, search_max=8.0, search_fail=16.0,
                     search_probes=3, search_missed="TTFT p99 412.0 ms > 300 ms"))
    for n, (rate, p99, meets) in enumerate(((2.0, 120.0, True), (8.0, 280.0, True), (16.0, 412.0, False))):
        rows.append(dict(search, cell_id=f"s-{n}", load="poisson", request_rate=rate, search_probe=n,
                         search_meets=meets, requests=32, requests_planned=32, ttft_ms_p99=p99,
                         search_checks=json.dumps({"ttft_p99_ms": {"value": p99, "lo": p99 - 20, "hi": p99 + 30,
                                                                   "slo": 300.0, "n": 32, "met": meets}}),
                         search_missed=None if meets else "TTFT p99 412.0 ms > 300 ms"))
    for row in rows:
        store.write_cell(row)
    return root


def test_report_telemetry_and_searches(tmp_path):
    """The telemetry panel: a row per ok cell with the prefix-cache hit rate (hits / queries) beside TTFT,
    the named workloads told apart, and every empty figure's reason; the SLO-search panel: per configuration
    the maximum met and the first miss, then every probe with its interval; report.md the same tables."""
    html_path, md_path = write_report(_serving_run(tmp_path / "serving"), tmp_path / "out" / "report.html")
    # bench show names the workload in the search's config too (escaped: rich would take '[prefix]' for markup)
    shown = CliRunner().invoke(app, ["show", str(tmp_path / "serving")], env={"COLUMNS": "250"})
    assert shown.exit_code == 0 and "vllm/tiny/fp32/default [prefix] in=256 out=16" in shown.output, shown.output
    text = html_path.read_text()
    rows = {(r["telemetry-table-config"][1], r["telemetry-table-load"][1]): r
            for r in html_table(text, "telemetry-table")}
    assert set(rows) == {("vllm/tiny/fp32/default/serve [prefix]", "c=4"), ("vllm/tiny/fp32/default/serve [chat]", "c=4"),
                         ("llamacpp/tiny/fp32/default/serve [prefix]", "c=4"),
                         ("vllm/tiny/fp32/default/serve [prefix]", "search rate, c&lt;=4")}
    v = rows["vllm/tiny/fp32/default/serve [prefix]", "c=4"]
    assert v["telemetry-table-workload"][1] == "prefix" and v["telemetry-table-ttft-p99"][1] == "41.50"
    assert v["telemetry-table-hit"] == ("0.375", "37.5% (384 / 1024 tokens)")
    assert v["telemetry-table-kv"][1] == "12.5%" and v["telemetry-table-queue"][1] == "3"
    assert v["telemetry-table-energy"][1] == "" and rows["vllm/tiny/fp32/default/serve [chat]", "c=4"][
        "telemetry-table-energy"][1] == "12.5 (rapl: package-0)"
    # the keys follow the TTFT columns: the hit rate sits beside them
    keys = re.findall(r'<th data-key="telemetry-table-([^"]+)"', text)
    assert keys.index("hit") == keys.index("ttft-p99") + 1
    missing = re.search(r"<details id='telemetry-missing'>(.*?)</details>", text, re.S).group(1)
    assert "energy, energy per token: no RAPL zone is readable (2 cells:" in missing
    assert "prefix-cache hit rate, preemptions, KV-cache usage max, requests waiting max: llama.cpp&#x27;s server " \
           "exports no such metric (1 cell: llamacpp/tiny/fp32/default/serve [prefix] c=4)" in missing
    # the search: its own row is a cell of the panel above too (an ok serve cell), its probes only here
    (s,) = html_table(text, "search-table")
    assert s["search-table-config"][1] == "vllm/tiny/fp32/default/serve [prefix]"
    assert (s["search-table-max"][1], s["search-table-fail"][1], s["search-table-probes"][1]) == ("8/s", "16/s", "3")
    assert s["search-table-slos"][1] == "ttft p99&lt;=300ms (point)" and "412.0 ms" in s["search-table-missed"][1]
    probes = html_table(text, "probe-table")
    assert [(p["probe-table-load"][1], p["probe-table-ttft"][1], p["probe-table-verdict"][1]) for p in probes] == [
        ("2/s", "120.0 [100.0, 150.0]", "yes"), ("8/s", "280.0 [260.0, 310.0]", "yes"),
        ("16/s", "412.0 [392.0, 442.0]", "no")]

    md = md_path.read_text()
    tel = md_table(md, "### Engine telemetry and energy")
    assert len(tel) == 4 and ["vllm/tiny/fp32/default/serve [prefix]", "prefix", "c=4", "20.00", "41.50",
                              "37.5% (384 / 1024 tokens)", "0", "12.5%", "3", "", "", "500.0"] in tel
    assert "- energy, energy per token: no RAPL zone is readable (2 cells:" in md
    search = md_table(md, "### SLO search")
    assert search[0][:7] == ["vllm/tiny/fp32/default/serve [prefix]", "256 / 16", "rate, c&lt;=4",   # inert Markdown
                             "ttft p99&lt;=300ms (point)", "8/s", "16/s", "3"]
    assert [r[1] for r in md_table(md, "Probes:")] == ["0", "1", "2"]
    if CHROMIUM:
        res = _chromium(tmp_path, "--dump-dom", html_path.as_uri() + "#sort=-telemetry-table-hit")
        assert res.returncode == 0 and not _console_errors(res.stderr), res.stderr[-2000:]
        shown = [r["telemetry-table-hit"][0] for r in html_table(res.stdout, "telemetry-table")]
        assert shown == ["0.75", "0.375", "", ""]   # blanks (llama.cpp, the search row) last


def test_report_telemetry_of_offline_cells(report):
    """A real run's hf cells: no engine telemetry, and the panel says why for each figure."""
    html_path, md_path = report
    text = html_path.read_text()
    missing = re.search(r"<details id='telemetry-missing'>(.*?)</details>", text, re.S).group(1)
    assert 'id="telemetry"' in text and re.search(r"<li>prefix-cache hit rate[^<]*: [^<]+\(3 cells: hf/tiny", missing)
    assert 'id="searches"' not in text and "### SLO search" not in md_path.read_text()
