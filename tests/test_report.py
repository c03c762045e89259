"""`bench report` / `ls` / `show` / `export` on a real run; the report opened in a headless Chromium.

The browser checks need Debian's `chromium` (apt-get install -y chromium); without it they skip.
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

from conftest import SMALL_MATRIX
from orchestrator.cli import app
from orchestrator.report import write_report
from orchestrator.report_data import pareto_front
from orchestrator.runner import run_matrix

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


def test_pareto_front():
    speed = np.array([1.0, 2.0, 3.0, 3.0, 0.5, 2.0, 4.0])
    kl = np.array([0.0, 1e-6, 1e-3, 1e-2, 0.0, 1e-6, 1e-3])
    # 1 (0): not beaten; 2 (1e-6) and its twin: on; 3 (1e-3) beaten by 4 (1e-3); 3 (1e-2) beaten;
    # 0.5 (0) beaten by 1 (0); 4 (1e-3): on
    assert pareto_front(speed, kl).tolist() == [True, True, False, False, False, True, True]


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
    md = md_path.read_text()
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

    res = runner.invoke(app, ["show", str(report_run.root)])
    assert res.exit_code == 0, res.output
    assert len(re.findall(r"^│ hf +│ tiny +│", res.output, re.M)) == 4 and "unsupported" in res.output

    cells = report_run.read_cells()
    lp_rows = len(pd.read_parquet(report_run.root / "logprobs"))
    res = runner.invoke(app, ["export", str(report_run.root), "--format", "csv", "-o", str(tmp_path / "csv")])
    assert res.exit_code == 0, res.output
    with open(tmp_path / "csv" / "cells.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(cells) == 4
    assert {r["cell_id"] for r in rows} == set(cells.cell_id)
    ok = next(r for r in rows if r["status"] == "ok")
    assert len(json.loads(ok["ttft_ms"])) == int(ok["requests"])  # list columns as JSON arrays
    assert "hf does not run quantization q4_0" in next(r["reason"] for r in rows if r["status"] == "unsupported")
    assert len(pd.read_csv(tmp_path / "csv" / "logprobs.csv")) == lp_rows

    res = runner.invoke(app, ["export", str(report_run.root), "--format", "jsonl", "-o", str(tmp_path / "jsonl")])
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

    from conftest import ROOT
    from orchestrator import report_data as rep
    from orchestrator.compaction import compact
    from orchestrator.store import RunStore

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
