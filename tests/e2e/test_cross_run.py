"""Regressions across runs, for real: hf and llama.cpp on the built-in model's architecture, six runs of
one matrix that differ in ways the cell ids do not see, in this order: A, A2, H, A3, C, B.

  A   the reference run       A2  the same again: its drift from A is the run-to-run noise (--noise-run)
  H   pinned as C below, with the busy loops for half of its repeats: they start when the first engine child
      has ended and the next has loaded, so one group's repeats run quiet and the other group's beside them
      (the test checks it from the repeats' timestamps). In a folder of its own: no history under the others'
      folder holds it (a busy run in the history widens every noise estimate drawn from it)
  A3  the same a third time: noise alone must not fail a gate whose speed bound is wider than this shared
      host's own swing between runs. The 5% bound of POLICY did fail it once in CI (llama.cpp batch 1 x0.786
      [0.695, 0.889] against a drift sd of 3.9% measured from A2, which ran right after A): a noise run beside
      OLD cannot see what another tenant does to the host later, so the repeat's gate uses REPEAT_POLICY
  B   the model rebuilt in place from another seed (same path, same config: only its fingerprint differs),
      batch 1 only: A's batch-2 cells are listed as only in OLD, never dropped (one run for both: a run
      costs a minute of the suite)
  C   every engine process pinned to one CPU core that three busy processes also use: a speed regression
      (one core alone is not one here: hf's two torch threads on two shared cores are slower than one thread;
      half a core was too little under a busy host's noise). Only the engines: run.python names a wrapper
      that starts them under taskset (run settings are not in the cell ids), so Ray and the driver keep their
      speed (pinning the whole `bench run` took four minutes, mostly Ray's start on a quarter core)
"""

from __future__ import annotations

import copy
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from orchestrator.execution.runner import run_matrix
from orchestrator.judge.cross_run import compare_runs
from tests.helpers import ROOT, bench_cmd

EXACT = {"type_k": "f32", "type_v": "f32", "flash_attn": "off"}
MATRIX = {
    "name": "regress",
    "models": {"tiny": None},           # a local copy of the built-in model, rebuilt in place for run B
    "axes": {"framework": ["hf", "llamacpp"], "model": ["tiny"], "quantization": ["fp32"], "batch_size": [1, 2],
             "input_len": [32], "output_len": [128]},   # batches of 20-300 ms: longer than scheduler slices
    # one thread each: two spinning threads on two shared cores made a run's speed swing 2x (llama.cpp) and
    # 4x (hf) from run to run, which no 5% bound survives; one thread is steady
    "flags": {"llamacpp": {"default": EXACT | {"n_threads": 1}}, "hf": {"default": {"num_threads": 1}}},
    # 8 repeats: the C run's quarter core is several times slower, its interval wholly below 0.95 (12 cost a
    # third more of the suite's longest module for nothing the assertions use)
    # paired timing off: the comparisons here are across runs, and run H's half-busy design needs one engine
    # group after the other (a timing twin would run the baseline's engine beside llama.cpp's)
    "measure": {"warmup": 2, "repeats": 8, "scoring_prompts": 2, "scoring_len": 24, "greedy_tokens": 8,
                "score_repeats": 2, "top_k": 8, "paired_timing": False},
    "run": {"cell_timeout_s": 300, "load_timeout_s": 600},
}
POLICY = {"rules": [{"match": {"framework": ["hf", "llamacpp"]}, "must_be": "lossless", "max_slowdown": 0.05,
                     "max_ttft_p99_increase": 0.5}]}
# a repeat on this host: the same quality rule; speed bounds beyond the 10-40% a shared host swings between runs
REPEAT_POLICY = {"rules": [{**POLICY["rules"][0], "max_slowdown": 0.5, "max_ttft_p99_increase": 1.0}]}


@pytest.fixture(scope="module")
def runs(ray_local, tmp_path_factory):
    from orchestrator.inputs.tiny_model import build_tiny_model

    d = tmp_path_factory.mktemp("regress")
    model = build_tiny_model(d / "model")
    data = copy.deepcopy(MATRIX)
    data["models"]["tiny"] = str(model)
    matrix = d / "m.yaml"
    matrix.write_text(yaml.safe_dump(data))
    out = {"dir": d, "matrix": matrix}
    out["A"] = run_matrix(matrix, d / "A").root
    out["A2"] = run_matrix(matrix, d / "A2").root
    # H: pinned as C, the busy loops started once the first engine child has ended and the next has loaded (its
    # cells' repeats quiet, the other group's beside the loops); in a folder of its own: no history under d/ holds it
    out["H"], out["H_busy_at"] = _half_busy_run(data, d / "half")
    out["A3"] = run_matrix(matrix, d / "A3").root
    # C: every engine process pinned to core 0, beside three busy loops there
    slow = copy.deepcopy(data)
    slow["run"]["python"] = dict.fromkeys(("hf", "llamacpp"), str(_pinned_python(d / "pinned-python")))
    (d / "pinned.yaml").write_text(yaml.safe_dump(slow))
    hogs = _busy_loops()
    try:
        out["C"] = run_matrix(d / "pinned.yaml", d / "C").root
    finally:
        _stop(hogs)
    small = copy.deepcopy(data)
    small["axes"]["batch_size"] = [1]
    (d / "small.yaml").write_text(yaml.safe_dump(small))
    build_tiny_model(model, seed=1)     # same path, same config, other weights
    out["B"] = run_matrix(d / "small.yaml", d / "B").root
    return out


def _pinned_python(path: Path, pids: Path | None = None) -> Path:
    """A wrapper that starts its interpreter on core 0; with `pids`, it first appends the pid of each engine
    child (`python -m adapters.worker SPEC OUT`: exec keeps the pid) and its OUT folder to that file."""
    log = f'case "$*" in *adapters.worker*) for a; do out=$a; done; echo "$$ $out" >> "{pids}";; esac\n' \
        if pids else ""
    path.write_text(f'#!/bin/sh\n{log}exec taskset -c 0 "{sys.executable}" "$@"\n')
    path.chmod(0o755)
    return path


def _busy_loops() -> list[subprocess.Popen]:
    # each busy loop in its own session: the kernel's autogroups share a core between sessions, and the
    # engine child has its own (setsid), so three loops in one session would take only half of the core
    return [subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(3)]


def _stop(hogs: list[subprocess.Popen]) -> None:
    for hog in hogs:
        hog.kill()
        hog.wait()


def _ended(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")   # not yet reaped
    except (FileNotFoundError, ProcessLookupError):
        return True


def _loaded(out: Path) -> bool:
    """Whether the engine child writing to `out` has loaded its engine (its events.jsonl says so)."""
    try:
        return '"event":"loaded"' in (out / "events.jsonl").read_text()     # compact JSON (model_dump_json)
    except FileNotFoundError:
        return False


def _second_half_begins(pids: Path) -> bool:
    """The first engine child has ended, and another is running with its engine loaded: its cells' repeats
    are next (the loops join after its load, which on a quarter core took 40 s of the suite for nothing)."""
    children = [(int(pid), Path(out)) for pid, out in (line.split(" ", 1) for line in
                                                        (pids.read_text().splitlines() if pids.exists() else ()))]
    ended = [_ended(pid) for pid, _ in children]
    return any(ended) and any(not e and _loaded(out) for e, (_, out) in zip(ended, children))


def _half_busy_run(data: dict, d: Path) -> tuple[Path, float]:
    """The matrix run with every engine process pinned to core 0, the busy loops joining it once the first
    engine child has ended and the next has loaded (one group's repeats quiet, the other's busy: half of the
    run's repeats), watched from a thread of the test through what the wrapper logs. Returns the run and when
    the loops began."""
    d.mkdir()
    pids = d / "engine-pids"
    half = copy.deepcopy(data)
    half["run"]["python"] = dict.fromkeys(("hf", "llamacpp"), str(_pinned_python(d / "python", pids)))
    (d / "half.yaml").write_text(yaml.safe_dump(half))
    hogs: list[subprocess.Popen] = []
    started: list[float] = []
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.01):
            if _second_half_begins(pids):
                hogs.extend(_busy_loops())
                started.append(time.time())
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        root = run_matrix(d / "half.yaml", d / "H").root
    finally:
        done.set()
        watcher.join()
        _stop(hogs)
    assert started, "no engine child ended before the run did: the busy loops never ran"
    return root, started[0]


def _gate(new, old, policy_path, *extra, noise=None) -> subprocess.CompletedProcess:
    noise = ["--noise-run", str(noise)] if noise else []
    return subprocess.run(bench_cmd("gate", str(new), "--against", str(old), "--policy", str(policy_path), *noise,
                                    *extra), cwd=ROOT, capture_output=True, text=True, timeout=600)


def _policy(runs, policy: dict = POLICY, name: str = "policy") -> str:
    path = runs["dir"] / f"{name}.yaml"
    path.write_text(yaml.safe_dump(policy))
    return str(path)


def test_a_repeat_of_a_run_matches_it_and_passes_the_gate(runs):
    df = compare_runs(runs["A3"], runs["A"], noise_run=runs["A2"])
    assert len(df) == 4 and df.only_in.isna().all()
    assert set(df.verdict) <= {"identical", "lossless"}, df[["framework", "verdict", "verdict_reason"]]
    assert (df.changed == "nothing recorded changed").all(), df.changed.tolist()
    for r in df.itertuples():
        assert r.tok_s_n == "8/8" and r.tok_s_lo <= r.tok_s_ratio <= r.tok_s_hi
        assert r.tok_s_call in ("faster", "slower", "no difference", "not distinguishable") and r.tok_s_run_sd >= 0
    # the run-to-run drift widens the interval beyond what the repeats alone give
    alone = compare_runs(runs["A3"], runs["A"]).set_index("cell_id")
    for r in df.itertuples():
        assert r.tok_s_lo <= alone.tok_s_lo[r.cell_id] and r.tok_s_hi >= alone.tok_s_hi[r.cell_id]
    proc = _gate(runs["A3"], runs["A"], _policy(runs, REPEAT_POLICY, "repeat-policy"), noise=runs["A2"])
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gate: pass" in proc.stdout


def test_a_rebuilt_model_is_caught_and_named(runs):
    df = compare_runs(runs["B"], runs["A"])
    df = df[df.only_in.isna()]
    assert len(df) == 2 and set(df.batch_size) == {1}
    assert "identical" not in set(df.verdict) and "n/a" not in set(df.verdict)
    for changed in df.changed:
        assert "model_fingerprint:" in changed, changed
    proc = subprocess.run(bench_cmd("compare", str(runs["B"]), "--against", str(runs["A"])), cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stderr
    assert "model_fingerprint" in proc.stdout
    assert _gate(runs["B"], runs["A"], _policy(runs)).returncode == 1


def test_one_busy_core_is_a_speed_regression_the_gate_fails(runs, tmp_path):
    df = compare_runs(runs["C"], runs["A"], noise_run=runs["A2"])
    shown = df[["framework", "batch_size", "tok_s_ratio", "tok_s_lo", "tok_s_hi", "tok_s_call"]]
    # a quarter of one core: every cell several times slower. A run on a busy 2-core host can itself have
    # one wild cell (a llama.cpp batch is ~15 ms: one preemption is a large share), so at least 3 of 4
    assert (df.tok_s_call == "slower").sum() >= 3 and (df.tok_s_hi < 0.95).sum() >= 3, shown
    assert set(df.verdict) <= {"identical", "lossless"}      # slower, not different
    junit = tmp_path / "gate.xml"
    proc = _gate(runs["C"], runs["A"], _policy(runs), "--junit", str(junit), noise=runs["A2"])
    print(proc.stdout)
    assert proc.returncode == 1 and "max_slowdown 0.05" in proc.stdout and "wholly below" in proc.stdout
    suite = ET.parse(junit).getroot().find("testsuite")
    cases = suite.findall("testcase")
    assert int(suite.get("tests")) == len(cases) == 4 * 3        # 4 cells x (must_be, 2 speed bounds)
    failed = [c for c in cases if c.find("failure") is not None]
    assert int(suite.get("failures")) == len(failed)
    assert sum("max_slowdown" in c.get("classname") for c in failed) >= 3          # the cells, on throughput
    assert not any("must_be" in c.get("classname") for c in failed)               # and not on quality
    md = _gate(runs["C"], runs["A"], _policy(runs), "--format", "md", noise=runs["A2"])
    assert md.returncode == 1 and md.stdout.startswith("### lossless-bench gate") and "FAIL" in md.stdout
    assert "| ❌ |" in md.stdout


def test_a_busy_host_is_no_speed_call_across_runs(runs, tmp_path):
    """OLD ran on a busy host (C: its engines on one core beside busy loops), NEW is A3, nothing else changed
    (the provenance says so). The repeats inside each run do not see a run's host state: without a
    run-to-run noise estimate no faster/slower call is made and the gate does not fail on speed; with the
    history's (the other runs of these cells under the results root: A and A2, which ran before A3, against
    C) there is still no call. A quiet history and a busy NEW stay a slowdown (the test above, and below)."""
    empty = tmp_path / "no-history"
    empty.mkdir()
    alone = compare_runs(runs["A3"], runs["C"], history=empty)
    shown = alone[["framework", "batch_size", "tok_s_ratio", "tok_s_lo", "tok_s_hi", "tok_s_call", "run_noise"]]
    assert alone.run_noise.isna().all() and set(alone.tok_s_call) == {"cannot judge"}, shown
    assert (alone.tok_s_lo > 1).sum() >= 3, shown      # the repeats alone would have called NEW faster
    hist = compare_runs(runs["A3"], runs["C"], history=runs["dir"])
    shown = hist[["framework", "batch_size", "tok_s_ratio", "tok_s_lo", "tok_s_hi", "tok_s_call", "run_noise"]]
    assert hist.run_noise.str.startswith("2 earlier run(s) under").all(), shown
    assert not hist.tok_s_call.isin(["faster", "slower"]).any(), shown
    assert (hist.tok_s_call == "not distinguishable").all(), shown    # a ratio of 4 on this host: none to see
    # the gate, NEW busy against a quiet OLD, with no estimate: speed bounds are not checked, and say so
    md = _gate(runs["C"], runs["A"], _policy(runs), "--format", "md", "--history", str(empty))
    assert md.returncode == 0 and md.stdout.count("not checked (require_run_noise: true would fail it)") == 8, md.stdout
    strict = runs["dir"] / "strict.yaml"
    strict.write_text(yaml.safe_dump({"rules": [POLICY["rules"][0] | {"require_run_noise": True}]}))
    assert _gate(runs["C"], runs["A"], strict, "--history", str(empty)).returncode == 1
    # by default the history is the folder holding OLD: A2 and A3 ran before C, quietly, so C is slower
    proc = _gate(runs["C"], runs["A"], _policy(runs))
    assert proc.returncode == 1 and "wholly below" in proc.stdout, proc.stdout


def test_a_host_busy_for_half_of_the_run_is_no_speed_call_across_runs(runs, tmp_path):
    """Two runs of one matrix, nothing else changed: OLD (H) with its engines pinned to one core, the busy
    loops there for half of its repeats (the group that ran second), NEW (A3) quiet. Without a run-to-run
    noise estimate no faster/slower call; with the history's (A and A2 beside H) none either. The call is
    `not distinguishable`, not `no difference`: the drift the history measures between H and the quiet runs
    is the busy half itself, far wider than the 5% speed tolerance, and an interval that holds it cannot lie
    within 5% (an honest `no difference` would need a noise estimate that does not see H's own swing)."""
    h, busy_at = runs["H"], runs["H_busy_at"]
    from orchestrator.store.run_store import RunStore

    cells = RunStore(h).read_cells_table(["cell_id", "repeat_started_at", "repeat_ended_at"]).to_pandas()
    quiet = {r.cell_id for r in cells.itertuples() if max(r.repeat_ended_at) < busy_at}
    busy = {r.cell_id for r in cells.itertuples() if min(r.repeat_started_at) > busy_at}
    # half of the repeats: one group's cells wholly before the loops, the other's wholly beside them
    assert len(quiet) == len(busy) == 2 and len(cells) == 4, (busy_at, cells)
    empty = tmp_path / "no-history"
    empty.mkdir()
    alone = compare_runs(runs["A3"], h, history=empty)
    shown = alone[["framework", "batch_size", "tok_s_ratio", "tok_s_lo", "tok_s_hi", "tok_s_call", "run_noise"]]
    assert alone.run_noise.isna().all() and set(alone.tok_s_call) == {"cannot judge"}, shown
    assert (alone.changed == "nothing recorded changed").all(), alone.changed.tolist()
    # the disturbance was real: the repeats alone would have called NEW faster where H was busy
    assert (alone[alone.cell_id.isin(busy)].tok_s_lo > 1).any(), shown
    hist = compare_runs(runs["A3"], h, history=runs["dir"])
    shown = hist[["framework", "batch_size", "tok_s_ratio", "tok_s_lo", "tok_s_hi", "tok_s_call", "run_noise"]]
    assert hist.run_noise.str.startswith("2 earlier run(s) under").all(), shown      # A and A2
    assert not hist.tok_s_call.isin(["faster", "slower"]).any(), shown
    assert (hist.tok_s_call == "not distinguishable").all(), shown
    proc = subprocess.run(bench_cmd("compare", str(runs["A3"]), "--against", str(h), "--history", str(empty)),
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "faster" not in proc.stdout and "slower" not in proc.stdout, proc.stdout
    # and the gate does not fail on it: without an estimate the bounds are not checked, with one nothing is outside
    assert _gate(runs["A3"], h, _policy(runs), "--history", str(empty)).returncode == 0
    proc = _gate(runs["A3"], h, _policy(runs), "--history", str(runs["dir"]))
    assert proc.returncode == 0, proc.stdout


def test_cells_in_one_run_only_are_listed(runs):
    df = compare_runs(runs["B"], runs["A"])
    gone = df[df.only_in == "old"]
    assert sorted(gone.framework) == ["hf", "llamacpp"] and set(gone.batch_size) == {2}
    assert all("only in OLD" in r for r in gone.verdict_reason)
    df = compare_runs(runs["A"], runs["B"])
    assert sorted(df[df.only_in == "new"].framework) == ["hf", "llamacpp"]
    # a gate over cells OLD does not have cannot pass them
    proc = _gate(runs["A"], runs["B"], _policy(runs))
    assert proc.returncode == 1 and "only in NEW" in proc.stdout


def test_match_pairs_on_named_axes_and_rejects_ambiguous_ones(runs):
    df = compare_runs(runs["A2"], runs["A"], match=["framework", "batch_size"])
    assert df.only_in.isna().all() and len(df) == 4
    proc = subprocess.run(bench_cmd("compare", str(runs["A2"]), "--against", str(runs["A"]), "--match", "framework"),
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and "name more axes" in proc.stderr


def test_usage_errors_exit_2(runs, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"rules": [{"match": {"framework": "hf"}, "max_slowdown": 0.05}]}))
    proc = subprocess.run(bench_cmd("gate", str(runs["A"]), "--policy", str(bad)), cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 2 and "give --against" in proc.stderr
    bad.write_text(yaml.safe_dump({"rules": [{"match": {"framework": "hf"}}]}))
    assert _gate(runs["A"], runs["A2"], bad).returncode == 2


def test_history_shows_one_point_per_run_and_what_changed(runs, tmp_path):
    from orchestrator.judge.history import history

    root = tmp_path / "results"
    root.mkdir()
    for name in ("A", "A2", "B"):      # in the order they ran
        (root / name).symlink_to(runs[name], target_is_directory=True)
    df = history(root)
    sizes = df.groupby(["cell_id", "batch_size"]).size()
    assert len(sizes) == 4 and {b: n for (_, b), n in sizes.items()} == {1: 3, 2: 2}  # B has batch 1 only
    for _, g in df.groupby("cell_id"):
        assert g.run.tolist() == ["A", "A2", "B"][:len(g)]
        assert g.changed.iloc[0] == "first run" and g.changed.iloc[1] == ""
        if len(g) == 3:
            assert "model_fingerprint" in g.changed.iloc[2]
    proc = subprocess.run(bench_cmd("history", str(root), "--config", "framework=hf"), cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stderr
    assert "3 runs" in proc.stdout and "llamacpp" not in proc.stdout
    page = (root / "history.html").read_text()
    assert "What changed between runs" in page and "model_fingerprint" in page
    bad = subprocess.run(bench_cmd("history", str(root), "--config", "framwork=hf"), cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert bad.returncode == 2 and "--config: unknown axis 'framwork'" in bad.stderr
