"""The env axis on a real engine and real Ray: `bench env` builds a second environment that differs from this one
in one package (tqdm, which transformers imports, at the version of the wheel `make env-pair-wheel` caches),
offline; one run of the built-in tiny model through transformers in both environments (`axes.env: [old,
new]`) loads both engines side by side and takes the timed repeats in turns, ABBA (the wall-clock times in
the rows show it); `bench compare` gives the paired NEW/OLD ratio with n, interval and test, and the
provenance diff that names the changed package and the env's variable; `bench gate` bounds the pair's
slowdown within the one run. And a pair whose one side dies at start: the other runs alone."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import time

import pytest
import yaml

from orchestrator.execution.engine_child.supervisor import PROJECT_ROOT
from tests.helpers import ROOT, bench_cmd

WHEELS = PROJECT_ROOT / ".cache" / "wheels"
OLD_TQDM = "4.67.1"   # Makefile: ENV_PAIR_TQDM
REPEATS = 6


@pytest.fixture(scope="module")
def env_run(ray_local, tiny_model, tmp_path_factory):
    from orchestrator.execution.runner import run_matrix

    wheel = WHEELS / f"tqdm-{OLD_TQDM}-py3-none-any.whl"
    assert wheel.exists(), f"{wheel} is missing: `make env-pair-wheel` downloads it (the test then runs offline)"
    d = tmp_path_factory.mktemp("env-axis")
    made = subprocess.run(bench_cmd("env", "old", "--pip", f"tqdm=={OLD_TQDM}", "--no-index", "--find-links", str(WHEELS),
                                    "--root", str(d / "venvs")), cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert made.returncode == 0, made.stderr
    assert f"tqdm {OLD_TQDM}" in made.stdout
    matrix = {
        "name": "env-axis-test",
        "models": {"tiny": "builtin:tiny"},
        "envs": {"old": {"python": str(d / "venvs" / "old" / "bin" / "python")},
                 "new": {"python": sys.executable, "env_vars": {"BENCH_ENV_TEST": "new"}}},
        "axes": {"framework": ["hf"], "model": ["tiny"], "batch_size": [1], "input_len": [16], "output_len": [8],
                 "env": ["old", "new"]},
        "measure": {"warmup": 1, "repeats": REPEATS, "scoring_prompts": 2, "scoring_len": 16, "greedy_tokens": 4,
                    "score_repeats": 1, "top_k": 4},
        "baseline": {"framework": "hf", "env": "old"},
        "run": {"cell_timeout_s": 120, "load_timeout_s": 300},
    }
    (d / "m.yaml").write_text(yaml.safe_dump(matrix))
    store = run_matrix(d / "m.yaml", d / "run", quiet=True)
    return d, store.read_cells().set_index("env")


def test_both_envs_ran_and_say_what_they_are(env_run):
    _, cells = env_run
    assert sorted(cells.index) == ["new", "old"]
    for env in ("old", "new"):
        assert cells.loc[env, "status"] == "ok", cells.loc[env, "reason"]
    facts = {env: json.loads(cells.loc[env, "env_facts"]) for env in ("old", "new")}
    assert facts["old"]["packages"]["tqdm"] == OLD_TQDM
    assert facts["new"]["packages"]["tqdm"] == importlib.metadata.version("tqdm") != OLD_TQDM
    assert facts["new"]["env_vars"] == {"BENCH_ENV_TEST": "new"} and facts["old"]["env_vars"] == {}
    assert cells.loc["old", "cell_id"] != cells.loc["new", "cell_id"]


def test_timed_repeats_took_turns_abba(env_run):
    _, cells = env_run
    spans = []
    for env in ("old", "new"):
        starts, ends = cells.loc[env, "repeat_started_at"], cells.loc[env, "repeat_ended_at"]
        assert len(starts) == len(ends) == REPEATS
        spans += [(float(s), float(e), env, i) for i, (s, e) in enumerate(zip(starts, ends))]
    spans.sort()
    for (_, end, *_), (start, *_) in zip(spans, spans[1:]):
        assert end <= start, "two timed repeats overlapped"
    # a0 b0 b1 a1 a2 b2 ... with a the first env of the axis
    want = [(env, r) for r in range(REPEATS) for env in (("old", "new") if r % 2 == 0 else ("new", "old"))]
    assert [(env, i) for *_, env, i in spans] == want


def test_compare_gives_the_paired_ratio_and_the_provenance_diff(env_run):
    d, _ = env_run
    proc = subprocess.run(bench_cmd("compare", str(d / "run")), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "env pairs" in out and f"n={REPEATS} pairs, paired t" in out, out
    new_tqdm = importlib.metadata.version("tqdm")
    assert f"changed: env_facts.packages.tqdm: {OLD_TQDM} -> {new_tqdm}" in out, out
    assert "changed: env_facts.env_vars.BENCH_ENV_TEST: (none) -> new" in out, out
    assert "changed: versions.torch" not in out   # the one package changed, nothing else
    js = subprocess.run(bench_cmd("compare", str(d / "run"), "--format", "json"), cwd=ROOT, capture_output=True,
                        text=True, timeout=120)
    rows = {r["env"]: r for r in json.loads(js.stdout[js.stdout.index("{"):])["cells"]}
    new = rows["new"]
    assert new["speed_test"] == "paired t" and new["speedup_lo"] <= new["speedup"] <= new["speedup_hi"]
    assert new["verdict"] == "identical"   # the same engine and weights: a tqdm version changes no logits


def test_gate_bounds_the_pairs_slowdown_within_one_run(env_run, tmp_path):
    d, _ = env_run
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({"rules": [{"match": {"env": "new"}, "must_be": "lossless", "max_slowdown": 0.9}]}))
    proc = subprocess.run(bench_cmd("gate", str(d / "run"), "--policy", str(policy)), cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    other = tmp_path / "ttft.yaml"   # within one run only the paired tok/s is bounded: anything else cannot judge
    other.write_text(yaml.safe_dump({"rules": [{"match": {"env": "new"}, "max_ttft_p99_increase": 0.1}]}))
    proc = subprocess.run(bench_cmd("gate", str(d / "run"), "--policy", str(other)), cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1 and "an env pair bounds output tokens/s only" in proc.stdout + proc.stderr, proc.stdout


def test_a_side_that_dies_holds_the_other_up_in_nothing(ray_local, tiny_model, tmp_path):
    """One env's interpreter exits at once: its cells are crashed rows, and the other env's run alone (the
    floor waits for no turn of a side whose cells have their rows)."""
    from orchestrator.execution.runner import run_matrix

    dead = tmp_path / "dead-python"
    dead.write_text("#!/bin/sh\necho 'this interpreter dies at start' >&2\nexit 3\n")
    dead.chmod(0o755)
    matrix = {"name": "env-axis-dead", "models": {"tiny": "builtin:tiny"},
              "envs": {"old": {"python": str(dead)}, "new": {"python": sys.executable}},
              "axes": {"framework": ["hf"], "model": ["tiny"], "batch_size": [1], "input_len": [16],
                       "output_len": [4], "env": ["old", "new"]},
              "measure": {"warmup": 1, "repeats": 2, "scoring_prompts": 1, "scoring_len": 16, "greedy_tokens": 2,
                          "score_repeats": 1, "top_k": 2},
              "baseline": {"framework": "hf", "env": "old"},
              "run": {"cell_timeout_s": 120, "load_timeout_s": 120}}
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(matrix))
    started = time.monotonic()
    cells = run_matrix(tmp_path / "m.yaml", tmp_path / "run", quiet=True).read_cells().set_index("env")
    assert time.monotonic() - started < 100   # no timeout waited out
    assert cells.loc["old", "status"] == "crashed" and "exited with code 3" in cells.loc["old", "reason"]
    assert cells.loc["new", "status"] == "ok", cells.loc["new", "reason"]
    assert len(cells.loc["new", "repeat_started_at"]) == 2
