"""orchestrator.judge.analysis on small hand-made run dirs written through the real RunStore."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from rich.console import Console

from orchestrator.judge.analysis import analyse
from orchestrator.matrix.baselines import parse_selector, parse_tolerances
from orchestrator.judge.gate import Policy, PolicyError, gate, load_policy
from orchestrator.judge.speed import speed_call
from orchestrator.matrix.models import Tolerances
from orchestrator.report.console import compare_table
from orchestrator.store.run_store import RunStore
from orchestrator.store.schema import LOGPROBS_SCHEMA

f32 = np.float32
LN = {p: float(f32(math.log(p))) for p in (0.1, 0.2, 0.28, 0.3, 0.31, 0.4, 0.49, 0.5, 0.52, 0.6, 0.7)}

# Two scoring prompts; teacher-forced positions 1..3, then 4 greedy tokens at positions 4..7.
PROMPT_POS, GEN_POS = (1, 2, 3), (4, 5, 6, 7)
BASE_TOPK = ([10, 11, 12], [0.5, 0.3, 0.1])   # tail 0.1; the actual token is 12 (p = 0.1)


def prompt_rows(ids=None, probs=None, token=12, override=None) -> dict:
    """(prompt_index, position) -> (token_id, logprob, topk_ids, topk_logprobs)."""
    rows = {}
    for pi in (0, 1):
        for pos in PROMPT_POS:
            i, p = (ids or BASE_TOPK[0]), (probs or BASE_TOPK[1])
            lps = [float(f32(math.log(x))) for x in p]
            rows[(pi, pos)] = (token, lps[i.index(token)] if token in i else LN[0.1], list(i), lps)
    rows.update(override or {})
    return rows


def gen_rows(tokens=None) -> dict:
    rows = {}
    tokens = tokens or {0: [20, 21, 22, 23], 1: [30, 31, 32, 33]}
    for pi, toks in tokens.items():
        for pos, t in zip(range(GEN_POS[0], GEN_POS[0] + len(toks)), toks):
            rows[(pi, pos)] = (t, LN[0.6], [t, t + 100, t + 200], [LN[0.6], LN[0.2], LN[0.1]])
    return rows


def lp_table(cell_id, reps: list[tuple[dict, dict]]) -> pa.Table:
    out = []
    for rep, (prompt, gen) in enumerate(reps):
        for kind, rows in (("prompt", prompt), ("generation", gen)):
            for (pi, pos), (tok, lp, ids, lps) in sorted(rows.items()):
                out.append(dict(run_id="r", cell_id=cell_id, kind=kind, repeat=rep, prompt_index=pi, position=pos,
                                token_id=tok, logprob=lp, topk_ids=ids, topk_logprobs=lps))
    return pa.Table.from_pylist(out, schema=LOGPROBS_SCHEMA)


def shifted(rows: dict, delta: float) -> dict:
    """Every logprob + delta, rounded to float32 as an engine would store it."""
    sh = lambda x: float(f32(f32(x) + f32(delta)))  # noqa: E731
    return {k: (t, sh(lp), ids, [sh(x) for x in lps]) for k, (t, lp, ids, lps) in rows.items()}


def write(store: RunStore, cell_id, framework="vllm", quantization="fp32", flags="default", batch_size=1,
          reps=None, status="ok", tok_s=(100.0, 102.0, 98.0), ttft=10.0, mem=1000, **extra):
    row = dict(run_id="r", cell_id=cell_id, engine_key=f"{framework}/{quantization}/{flags}", framework=framework,
               model="tiny", quantization=quantization, flags=flags, batch_size=batch_size, input_len=32,
               output_len=16, status=status, output_tok_s=float(np.mean(tok_s)) if tok_s else None,
               output_tok_s_runs=list(tok_s) if tok_s else None, ttft_ms_p50=ttft, peak_mem_bytes=mem, **extra)
    store.write_cell(row, lp_table(cell_id, reps) if reps else None)


def same(n=2):
    return [(prompt_rows(), gen_rows())] * n


def run_dir(tmp_path, baseline=None):
    store = RunStore(tmp_path / "run")
    store.write_manifest({"matrix": {"baseline": baseline or {"framework": "hf", "quantization": "fp32"},
                                     "tolerances": {}}})
    write(store, "base", framework="hf", reps=same())
    return store


def row(df, cell_id) -> dict:
    return df.set_index("cell_id").loc[cell_id].to_dict()


def test_identical_and_baseline_fallback(tmp_path):
    store = run_dir(tmp_path)
    write(store, "v1", reps=same())
    write(store, "v4", batch_size=4, reps=same())
    df = analyse(store.root)
    assert list(df.cell_id) == ["base", "v1", "v4"]
    b, v1, v4 = row(df, "base"), row(df, "v1"), row(df, "v4")
    assert (b["verdict"], b["baseline_cell_id"], b["baseline_match"]) == ("identical", "base", "exact")
    assert (v1["verdict"], v1["verdict_reason"]) == ("identical", "bitwise identical to base")
    assert v1["max_abs"] == 0.0 and v1["kl_mean"] == 0.0 and v1["kl_max"] == 0.0
    assert v1["top1"] == 1.0 and v1["greedy_match"] == 1.0 and v1["greedy_close"] == 1.0
    assert v1["ppl_base"] == pytest.approx(10.0, rel=1e-6) and v1["ppl_rel"] == 0.0
    assert (v1["n_positions"], v1["n_gen_prompts"], v1["n_gen_tokens"]) == (6, 2, 8)
    assert math.isnan(v1["first_div_min"])
    assert v4["verdict"] == "identical"
    assert v4["baseline_match"] == "fallback: baseline batch_size=1 (none at batch_size=4)"
    # the vllm engine key has batch 1 and 4: batch invariance measured, and run-to-run
    assert v4["bi_identical"] and v4["bi_max_abs"] == 0.0 and v4["rr_identical"]
    assert b["noise_max_abs"] == 0.0 and b["noise_top1"] == 1.0


def test_shift_1e6_is_lossless(tmp_path):
    store = run_dir(tmp_path)
    write(store, "v", reps=[(shifted(prompt_rows(), 1e-6), shifted(gen_rows(), 1e-6))] * 2)
    v = row(analyse(store.root), "v")
    diffs = [abs(float(f32(f32(x) + f32(1e-6))) - x) for x in (LN[0.1],)]
    assert v["max_abs"] == pytest.approx(max(diffs), rel=1e-12)   # the actual token's logprob
    assert 5e-7 < v["max_abs"] < 2e-6 and v["mean_abs"] == pytest.approx(v["max_abs"], rel=1e-12)
    assert abs(v["kl_mean"]) < 1e-9 and v["top1"] == 1.0 and v["greedy_match"] == 1.0
    assert v["frac_over_atol"] == 0.0 and not v["identical"]
    assert (v["verdict"], v["verdict_reason"]) == ("lossless", "not bit-identical; within the lossless tolerances")
    # re-judged with a tighter atol, given directly or through the manifest's matrix
    strict = row(analyse(store.root, tolerances=parse_tolerances("atol=1e-7")), "v")
    assert (strict["verdict"], strict["verdict_reason"]) == ("near-lossless", f"max_abs {v['max_abs']:.1e} > atol 1.0e-07")
    store.write_manifest({"matrix": {"baseline": {"framework": "hf"}, "tolerances": {"atol": 1e-7}}})
    assert row(analyse(store.root), "v")["verdict_reason"] == strict["verdict_reason"]


def test_kl_two_position_toy(tmp_path):
    """KL(base || cell) by hand: one position with equal id lists, one where the cell lacks an id."""
    store = RunStore(tmp_path / "run")
    base_p = {(0, 1): (1, LN[0.6], [1, 2], [LN[0.6], LN[0.3]]), (0, 2): (1, LN[0.7], [1, 2], [LN[0.7], LN[0.2]])}
    cell_p = {(0, 1): (1, LN[0.5], [1, 2], [LN[0.5], LN[0.4]]), (0, 2): (1, LN[0.7], [1, 3], [LN[0.7], LN[0.2]])}
    write(store, "base", framework="hf", reps=[(base_p, {})])
    write(store, "v", reps=[(cell_p, {})])
    v = row(analyse(store.root), "v")
    e = lambda k: math.exp(LN[k])  # noqa: E731  (the stored float32 values)
    kl_a = e(.6) * (LN[.6] - LN[.5]) + e(.3) * (LN[.3] - LN[.4]) \
        + (1 - e(.6) - e(.3)) * math.log((1 - e(.6) - e(.3)) / (1 - e(.5) - e(.4)))
    # id 2 is not in the cell's top-k: q = min(the cell's k-th prob .2, its tail .1 / 1 missing) = .1,
    # and the cell's tail keeps the rest (.3 - .1)
    q2 = min(e(.2), 1 - e(.7) - e(.2))
    kl_b = e(.2) * (LN[.2] - math.log(q2)) + (1 - e(.7) - e(.2)) * math.log((1 - e(.7) - e(.2)) / (1 - e(.7) - q2))
    # the same in exact arithmetic: .6 ln(.6/.5) + .3 ln(.3/.4), and .2 ln(.2/.1) + .1 ln(.1/.2)
    assert kl_a == pytest.approx(0.6 * math.log(1.2) + 0.3 * math.log(0.75), abs=1e-6)
    assert kl_b == pytest.approx(0.1 * math.log(2), abs=1e-6)
    assert v["kl_max"] == pytest.approx(kl_b, rel=1e-9)
    assert v["kl_mean"] == pytest.approx((kl_a + kl_b) / 2, rel=1e-9)
    assert v["top1"] == 1.0 and v["max_abs"] == pytest.approx(LN[.6] - LN[.5], rel=1e-12)
    assert v["frac_over_atol"] == 0.5
    assert math.isnan(v["greedy_match"])  # no generation rows: the text layer is absent, not failed
    assert v["verdict"] == "lossy" and f"kl_mean {(kl_a + kl_b) / 2:.3g} > kl_near 0.01" in v["verdict_reason"]


def test_flipped_top1_is_worse(tmp_path):
    store = run_dir(tmp_path)
    flip = {(0, 2): (12, LN[0.1], [11, 10, 12], [LN[0.5], LN[0.3], LN[0.1]])}
    write(store, "v", reps=[(prompt_rows(override=flip), gen_rows())] * 2)
    v = row(analyse(store.root), "v")
    assert v["top1"] == pytest.approx(5 / 6, rel=1e-12)
    one = (math.exp(LN[.5]) - math.exp(LN[.3])) * (LN[.5] - LN[.3])   # = 0.2 ln(5/3)
    assert v["kl_max"] == pytest.approx(one, rel=1e-9) and v["kl_mean"] == pytest.approx(one / 6, rel=1e-9)
    assert v["max_abs"] == 0.0 and v["greedy_match"] == 1.0
    assert v["verdict"] == "lossy"
    assert v["verdict_reason"] == "kl_mean 0.017 > kl_near 0.01; top1 0.833 < top1_near 0.95"


def test_truncated_generation_and_close(tmp_path):
    store = run_dir(tmp_path)
    trunc = gen_rows({0: [20, 21, 22, 23], 1: [30, 31]})          # prompt 1 stops after 2 tokens
    write(store, "trunc", reps=[(prompt_rows(), trunc)])
    # prompt 0 diverges at step 1 to a token in the baseline's top-k, and keeps the baseline's in its own
    close = gen_rows({0: [20, 121, 7, 8], 1: [30, 31, 32, 33]})
    close[(0, 5)] = (121, LN[0.6], [121, 21, 221], [LN[0.6], LN[0.2], LN[0.1]])
    write(store, "close", reps=[(prompt_rows(), close)])
    missing = {k: v for k, v in gen_rows().items() if k[0] == 0}          # no tokens at all for prompt 1
    write(store, "missing", reps=[(prompt_rows(), missing)])
    longer = gen_rows({0: [20, 21, 22, 23, 24], 1: [30, 31, 32, 33]})     # one token past the baseline's
    write(store, "longer", reps=[(prompt_rows(), longer)])
    df = analyse(store.root)
    t, c = row(df, "trunc"), row(df, "close")
    assert (row(df, "missing")["first_div_min"], row(df, "missing")["greedy_match"]) == (0, 0.5)
    assert row(df, "missing")["n_gen_prompts"] == 2 and row(df, "missing")["n_gen_tokens"] == 4
    assert (row(df, "longer")["first_div_min"], row(df, "longer")["greedy_match"]) == (4, 0.5)
    assert (t["first_div_min"], t["first_div_mean"], t["greedy_match"], t["greedy_close"]) == (2, 2, 0.5, 0.5)
    assert t["max_abs"] == 0.0 and not t["identical"]
    assert t["verdict"] == "lossy" and t["verdict_reason"] == "greedy_close 0.5 < greedy_match_near 0.9"
    assert (c["first_div_min"], c["greedy_match"], c["greedy_close"]) == (1, 0.5, 1.0)
    assert c["verdict"] == "near-lossless"
    assert c["verdict_reason"] == "greedy_match 0.5 < greedy_match_lossless 1"


def test_kl_orders_small_and_large_changes(tmp_path):
    store = run_dir(tmp_path)
    write(store, "small", reps=[(prompt_rows(probs=[0.49, 0.31, 0.1]), gen_rows())])
    write(store, "large", reps=[(prompt_rows(ids=[12, 11, 10]), gen_rows())])   # 10 and 12 swap
    df = analyse(store.root)
    s, lg = row(df, "small"), row(df, "large")
    assert 0 < s["kl_mean"] < lg["kl_mean"]
    assert s["kl_mean"] == pytest.approx(0.5 * math.log(.5 / .49) + .3 * math.log(.3 / .31), rel=1e-5)
    assert lg["kl_mean"] == pytest.approx(0.5 * math.log(5) + 0.1 * math.log(0.2), rel=1e-5)
    assert (s["verdict"], s["verdict_reason"]) == ("near-lossless", "kl_mean 2.6e-04 > kl_lossless 1.0e-04")
    assert s["ppl_rel"] == 0.0
    assert lg["verdict"] == "lossy" and lg["top1"] == 0.0
    assert lg["ppl_rel"] == pytest.approx(math.exp(-LN[.5]) / math.exp(-LN[.1]) - 1, rel=1e-6)  # ppl 10 -> 2
    assert lg["verdict_reason"] == ("kl_mean 0.644 > kl_near 0.01; top1 0 < top1_near 0.95; "
                            "|ppl_rel| 0.8 > ppl_rel_near 0.02")


def test_engine_deviation_named_against_a_baseline_without_it(tmp_path):
    """llama.cpp's f16 GELU on a GELU model (LoadFacts.engine_deviation, the adapter's): a near-lossless or lossy
    cell's reason names it after the metrics where the baseline does not share it; against a baseline that does
    (a llama.cpp fp32 baseline for its q8_0) the reason stays the metrics'."""
    gelu = "engine property, not a conversion fault: llama.cpp's CPU GELU rounds to f16 (gpt2 is a GELU model)"
    store = run_dir(tmp_path)
    write(store, "lcpp", framework="llamacpp", reps=[(prompt_rows(probs=[0.49, 0.31, 0.1]), gen_rows())],
          engine_deviation=gelu)
    write(store, "silu", framework="vllm", reps=[(prompt_rows(probs=[0.49, 0.31, 0.1]), gen_rows())])
    df = analyse(store.root)
    assert row(df, "lcpp")["verdict_reason"] == "kl_mean 2.6e-04 > kl_lossless 1.0e-04; " + gelu
    assert row(df, "silu")["verdict_reason"] == "kl_mean 2.6e-04 > kl_lossless 1.0e-04"
    shared = run_dir(tmp_path / "shared", baseline={"framework": "llamacpp", "quantization": "fp32"})
    write(shared, "lbase", framework="llamacpp", reps=same(), engine_deviation=gelu)
    write(shared, "q8", framework="llamacpp", quantization="q8_0",
          reps=[(prompt_rows(probs=[0.49, 0.31, 0.1]), gen_rows())], engine_deviation=gelu)
    assert row(analyse(shared.root), "q8")["verdict_reason"] == "kl_mean 2.6e-04 > kl_lossless 1.0e-04"


def test_noise_floor_relaxes_lossless(tmp_path):
    store = RunStore(tmp_path / "run")
    base = prompt_rows()
    # the baseline is not deterministic: repeat 1 is 5e-3 off; its batch-8 cell equals batch 1
    write(store, "base", framework="hf", reps=[(base, gen_rows()), (shifted(base, 5e-3), gen_rows())])
    write(store, "base8", framework="hf", batch_size=8, reps=[(base, gen_rows())])
    write(store, "within", reps=[(shifted(base, 3e-3), gen_rows())] * 2)
    write(store, "beyond", reps=[(shifted(base, 1.5e-2), gen_rows())] * 2)
    df = analyse(store.root)
    b, w, o = row(df, "base"), row(df, "within"), row(df, "beyond")
    noise = abs(float(f32(f32(LN[.1]) + f32(5e-3))) - LN[.1])
    assert b["rr_max_abs"] == pytest.approx(noise, rel=1e-12) and not b["rr_identical"]
    assert b["bi_max_abs"] == 0.0 and b["bi_identical"]
    assert w["noise_max_abs"] == pytest.approx(noise, rel=1e-12) and w["noise_kl_mean"] > 0
    assert w["rr_identical"] and math.isnan(w["bi_max_abs"])   # the vllm engine has one batch size
    assert w["max_abs"] > Tolerances().atol
    assert w["verdict"] == "lossless"
    assert w["verdict_reason"] == ("not bit-identical; within the baseline's noise floor: max_abs 3.0e-03 within noise 5.0e-03; "
                           "|ppl_rel| 3.0e-03 within noise 5.0e-03")
    assert o["verdict"] == "near-lossless"
    assert o["verdict_reason"] == ("max_abs 0.015 > atol 1.0e-03; kl_mean 1.1e-03 > kl_lossless 1.0e-04; "
                           "|ppl_rel| 0.0149 > ppl_rel_lossless 1.0e-03")
    # without the noise floor the same cell is judged by the tolerances alone
    strict = row(analyse(store.root, tolerances=Tolerances(noise_factor=0)), "within")
    assert strict["verdict"] == "near-lossless" and strict["verdict_reason"].startswith("max_abs 3.0e-03 > atol 1.0e-03")


def test_speed_and_na_cells(tmp_path):
    store = run_dir(tmp_path)
    write(store, "fast", reps=same(), tok_s=(200.0, 210.0, 190.0), ttft=5.0, mem=250)
    write(store, "oom", status="failed", reason="CUDA out of memory")
    write(store, "nolp", reps=None)
    df = analyse(store.root)
    f = row(df, "fast")
    assert f["speedup"] == pytest.approx(2.0, rel=1e-12)
    # Welch t interval on log(200, 210, 190) - log(100, 102, 98), df 2.62; the same numbers as
    # exp(scipy.stats.ttest_ind(log a, log b, equal_var=False).confidence_interval())
    assert (f["speedup_lo"], f["speedup_hi"]) == pytest.approx((1.7947403787777645, 2.225612040010567), rel=1e-9)
    assert (f["speed_call"], f["speedup_n_cell"], f["speedup_n_base"]) == ("faster", 3, 3)
    # the call is the test's q: Welch's p (scipy's ttest_ind on the logs) adjusted over the run's ok cells' speed
    # tests (fast and nolp; the baseline against itself and a failed cell are none): BH, q = p x 2 / 1
    assert f["speed_p"] == pytest.approx(4.6198826e-4, rel=1e-6) and f["speed_q"] == pytest.approx(2 * f["speed_p"])
    assert f["ttft_ratio"] == 0.5 and f["mem_saving"] == 0.75
    b = row(df, "base")
    assert b["speedup"] == 1.0 and b["speedup_lo"] < 1.0 < b["speedup_hi"] and b["speed_call"] == "no difference"
    assert speed_call([math.nan, 1.01, 0.8, 1.0], [math.nan, 1.3, 0.99, 1.0], 0.05) == [None, "faster", "slower",
                                                                                         "no difference"]
    # an interval that holds 1 but reaches past the tolerance could hide a change of its size: no "no difference"
    assert speed_call([0.97, 0.9, 1 / 1.05], [1.06, 1.02, 1.05], 0.05) == ["not distinguishable", "not distinguishable",
                                                                          "no difference"]
    assert speed_call([0.92], [1.1], 0.1) == ["no difference"]
    again = analyse(store.root)   # no resampling: re-running gives the same interval
    assert row(again, "fast")["speedup_lo"] == f["speedup_lo"]
    assert (row(df, "oom")["verdict"], row(df, "oom")["verdict_reason"]) == ("n/a", "status failed: CUDA out of memory")
    assert (row(df, "nolp")["verdict"], row(df, "nolp")["verdict_reason"]) == ("n/a", "no logprobs stored for this cell")
    console = Console(record=True, width=250)
    console.print(compare_table(df))
    out = console.export_text()
    assert "identical" in out and "2.00x [1.79, 2.23]" in out and "faster" in out and "n/a" in out


def test_baseline_argument_and_missing_baseline(tmp_path):
    store = run_dir(tmp_path)
    write(store, "v", reps=[(prompt_rows(probs=[0.49, 0.31, 0.1]), gen_rows())])
    df = analyse(store.root, baseline=parse_selector("framework=vllm"))
    assert row(df, "base")["baseline_cell_id"] == "v" and row(df, "v")["verdict"] == "identical"
    df = analyse(store.root, baseline={"framework": "hf", "quantization": "fp16"})
    assert row(df, "v")["verdict"] == "n/a"
    assert row(df, "v")["verdict_reason"] == "no ok baseline cell with logprobs for framework=hf, model=tiny, quantization=fp16, flags=default"


def test_empty_run(tmp_path):
    df = analyse(tmp_path / "nothing")
    assert df.empty and {"verdict", "verdict_reason", "kl_mean", "speedup_lo", "noise_max_abs"} <= set(df.columns)


def test_parse_selector_and_tolerances():
    assert parse_selector("framework=hf, quantization=fp32,batch_size=1") == \
        {"framework": "hf", "quantization": "fp32", "batch_size": 1}
    with pytest.raises(ValueError, match="unknown axis 'framwork'"):
        parse_selector("framwork=hf")
    with pytest.raises(ValueError, match="batch_size must be an integer"):
        parse_selector("batch_size=big")
    assert parse_tolerances("atol=1e-4,kl_near=0.02") == Tolerances(atol=1e-4, kl_near=0.02)
    with pytest.raises(ValueError, match="tolerances"):
        parse_tolerances("atoll=1")


def test_gate(tmp_path):
    store = run_dir(tmp_path)
    write(store, "v", reps=[(shifted(prompt_rows(), 1e-6), gen_rows())])
    write(store, "oom", framework="vllm", quantization="fp16", status="failed", reason="OOM")
    df = analyse(store.root)
    ok = Policy.model_validate({"rules": [{"match": {"framework": "vllm", "quantization": "fp32"},
                                           "must_be": "lossless"},
                                          {"match": {"framework": "hf"}, "must_be": "identical"}]})
    assert gate(df, ok) == (True, [])
    # a value no cell of the run has is a mistake in the policy, said with what the run has
    unknown = Policy.model_validate({"rules": [{"match": {"framework": "vllm", "quantization": ["fp32", "fp8"]},
                                                "must_be": "identical"}]})
    with pytest.raises(PolicyError) as err:
        gate(df, unknown)
    assert err.value.problems == ["rules[0].match.quantization: no cell of the run has 'fp8' (it has: fp16, fp32)"]
    # a combination no cell has (values the run has) fails as a check
    bad = Policy.model_validate({"rules": [{"match": {"framework": ["vllm", "hf"], "quantization": ["fp32", "fp16"]},
                                            "must_be": "identical"}]})
    passed, lines = gate(df, bad)
    assert not passed
    assert lines == [
        "rule 0 (must_be identical): no cell for framework=hf, quantization=fp16",
        "rule 0 (must_be identical): oom vllm/tiny/fp16/default batch=1: n/a: status failed: OOM",
        "rule 0 (must_be identical): v vllm/tiny/fp32/default batch=1: lossless: "
        "not bit-identical; within the lossless tolerances",
    ]


def test_policy_validation(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text("rules:\n  - match: {framwork: vllm}\n    must_be: perfect\n")
    with pytest.raises(PolicyError) as err:
        load_policy(path)
    assert err.value.problems == [
        "rules[0].match: Value error, unknown axis 'framwork' (known: framework, model, quantization, "
        "batch_size, flags, input_len, output_len, mode, request_rate, workload, env)",
        "rules[0].must_be: Input should be 'identical', 'lossless' or 'near-lossless'",
    ]
    path.write_text("rules:\n  - match: {batch_size: big, quantization: []}\n    must_be: lossless\n")
    with pytest.raises(PolicyError, match="batch_size: expected an integer, got 'big'"):
        load_policy(path)
    path.write_text("rules: []\n")
    with pytest.raises(PolicyError, match="rules: List should have at least 1 item"):
        load_policy(path)
    path.write_text("rules:\n  - match: {framework: vllm, batch_size: [1, 8]}\n    must_be: near-lossless\n")
    assert load_policy(path).rules[0].match == {"framework": "vllm", "batch_size": [1, 8]}


def test_gate_max_error_rate_with_its_interval(tmp_path):
    """Served cells with failed requests: the error proportion with its 95% Clopper-Pearson interval;
    the rule fails when the interval lies wholly above the bound, and a passing speed rule does not hide it."""
    import json

    from scipy.stats import binomtest
    from typer.testing import CliRunner

    from orchestrator.cli import app
    from orchestrator.judge.gate import error_interval

    store = run_dir(tmp_path)
    serve = dict(mode="serve", request_rate=float("inf"), load="closed")
    write(store, "bad", reps=same(), requests=90, requests_sent=100, errors=10,
          errors_by_kind=json.dumps({"http 503": 8, "timeout": 2}), **serve)
    write(store, "few", framework="vllm", quantization="fp16", reps=same(), requests=98, requests_sent=100, errors=2,
          errors_by_kind=json.dumps({"timeout": 2}), **serve)
    write(store, "none", framework="vllm", quantization="bf16", reps=same(), requests=50, requests_sent=50, errors=0,
          errors_by_kind="{}", **serve)
    write(store, "down", framework="vllm", quantization="fp8", status="failed", reason="server did not start", **serve)
    lo, hi = error_interval(10, 100)
    ci = binomtest(10, 100).proportion_ci(0.95, method="exact")
    assert (lo, hi) == (ci.low, ci.high) and 0.04 < lo < 0.05 and 0.17 < hi < 0.18   # 10/100: [4.9%, 17.6%]
    df = analyse(store.root)
    policy = Policy.model_validate({"rules": [{"match": {"framework": "vllm"}, "max_error_rate": 0.01}]})
    passed, lines = gate(df, policy)
    assert not passed
    errs = [x for x in lines if "max_error_rate" in x]
    assert errs == [
        "rule 0 (max_error_rate 0.01): bad vllm/tiny/fp32/default/serve c=1: errors 10/100 = 10.00% "
        f"[95% CI {lo:.2%}, {hi:.2%}] (http 503 8, timeout 2): wholly above 1.00%",
        "rule 0 (max_error_rate 0.01): down vllm/tiny/fp8/default/serve c=1: cannot judge the error rate: no "
        "requests counted (status failed)"]
    # 2 of 100 against 1%: the interval [0.24%, 7.0%] holds 1%, noise alone does not fail; 0 of 50 passes
    # 0 allows none: 2 failed of 100 fail it
    zero = Policy.model_validate({"rules": [{"match": {"framework": "vllm", "quantization": "fp16"},
                                             "max_error_rate": 0}]})
    assert gate(df, zero)[1] == ["rule 0 (max_error_rate 0): few vllm/tiny/fp16/default/serve c=1: errors 2/100 = "
                                 "2.00% [95% CI 0.24%, 7.04%] (timeout 2): wholly above 0.00%"]
    # an offline cell passes (no requests to fail); the CLI takes the rule without --against
    path = tmp_path / "policy.yaml"
    path.write_text("rules:\n  - match: {framework: hf}\n    max_error_rate: 0.01\n")
    res = CliRunner().invoke(app, ["gate", str(store.root), "--policy", str(path)])
    assert res.exit_code == 0 and "gate: pass" in res.stdout, res.output
    path.write_text("rules:\n  - match: {framework: vllm, quantization: fp32}\n    max_error_rate: 1.5\n")
    res = CliRunner().invoke(app, ["gate", str(store.root), "--policy", str(path)])
    assert res.exit_code == 2 and "rules[0].max_error_rate: Input should be less than 1" in res.stderr
