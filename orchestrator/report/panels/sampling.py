"""The sampling layer as both report formats show it (orchestrator/judge/sampling_verdicts.py): one row per cell
with samples, its columns defined once here (key, header, sort value, text, css class) for the HTML panel
(report_html.py) and the report.md table (report_md.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import pandas as pd

from orchestrator.report.data import first_line, num
from orchestrator.store.manifest import Manifest
from orchestrator.values import finite

SAMPLING_VERDICT_ORDER = ("different", "sampler differs", "not distinguishable", "same distribution", "identical",
                          "n/a")
SAMPLING_VERDICT_COLOR = {"identical": "#1a7f37", "same distribution": "#4caf50", "not distinguishable": "#d4a017",
                          "sampler differs": "#9c27b0", "different": "#d73027", "n/a": "#8c8c8c"}


@dataclass
class SamplingLayer:
    table: pd.DataFrame          # analyse_sampling: one row per ok cell with samples
    error: str | None = None     # why the sampling analysis could not run
    alpha: float = 0.01
    shift: float = 0.05


def sampling_layer(judged: tuple[pd.DataFrame | None, str | None], manifest: Manifest) -> SamplingLayer | None:
    """The layer as judge_run judged it (orchestrator/report/data.py: load), or why not (a failure leaves the rest of
    the report standing); None for a run whose matrix drew no samples (the report then has no sampling section)."""
    if not manifest.sampling:
        return None
    table, error = judged
    alpha, shift = manifest.tolerances.sampling_alpha, manifest.tolerances.sampling_shift
    if table is None:
        return SamplingLayer(pd.DataFrame(), first_line(error or "not judged", 400), alpha, shift)
    return SamplingLayer(table, None, alpha, shift)


def no_sampling_text(manifest: Manifest) -> str:
    if not manifest.sampling:
        return "This run drew no seeded samples: set measure.sampling in the matrix for the sampling layer."
    return "No cell stored samples (every cell not ok, or its engine could not sample: see each cell's reason)."


def _seed(r: dict) -> str:
    v = r.get("seed_verdict")
    if not finite(r.get("seed_identical")):
        return "not compared" if v == "n/a" else ""
    div = f", first divergence at token {r['seed_first_div_mean']:.1f}" if finite(r.get("seed_first_div_mean")) else ""
    return f"{r['seed_identical']:.0%} identical{div}" + ("" if r.get("seed_promised") else " (not promised)")


def _two(r: dict) -> str:
    if not finite(r.get("dist_p")):
        return ""
    could = f", could see {r['dist_detectable']:.3g}" if finite(r.get("dist_detectable")) else ""
    return (f"p={r['dist_p']:.3g}, shift {r['dist_shift']:+.4f}{could}, n {int(r['dist_n_cell'])} vs "
            f"{int(r['dist_n_base'])} ({int(r['dist_seeds_cell'])} vs {int(r['dist_seeds_base'])} seeds)")


def _model(r: dict) -> str:
    """The model test: every sampled token where the baseline's engine rescored them, else the first token."""
    if finite(r.get("whole_p")):
        out = f" ({int(r['whole_outside'])} outside)" if r.get("whole_outside") else ""
        return (f"whole sample p={r['whole_p']:.3g}, {int(r['whole_n'])} tokens of {int(r['whole_samples'])} samples, "
                f"mean PIT {r['whole_mean_pit']:.3f}{out}")
    return "first token " + _first(r)


def _first(r: dict) -> str:
    if not finite(r.get("first_p")):
        return f"n/a: {first_line(r.get('first_reason'), 160)}" if isinstance(r.get("first_reason"), str) else ""
    out = f" ({int(r['first_outside'])} outside)" if r.get("first_outside") else ""
    return f"p={r['first_p']:.3g}, n {int(r['first_n'])} draws, {int(r['first_prompts'])} prompts{out}"


def _need(r: dict) -> str:
    out = num(r.get("seeds_needed"), ".0f")
    if r.get("dist_verdict") in ("same distribution", "not distinguishable") and finite(r.get("seeds_for_shift")):
        out += f" (this shift: ~{int(r['seeds_for_shift'])})"
    return out


def columns() -> list[tuple[str, str, Callable[[dict], Any], Callable[[dict], str], str]]:
    rank = {v: i for i, v in enumerate(SAMPLING_VERDICT_ORDER)}
    return [
        ("config", "engine config", lambda r: r["config"], lambda r: r["config"], ""),
        ("batch", "batch", lambda r: r["batch_size"], lambda r: str(r["batch_size"]), "n"),
        ("samples", "samples", lambda r: r.get("samples_n"), lambda r: num(r.get("samples_n"), ".0f"), "n"),
        ("repeatable", "repeatable", lambda r: r.get("repeatable"),
         lambda r: f"{r['repeatable']:.0%}" if finite(r.get("repeatable")) else "", "n"),
        ("seed", "seed by seed", lambda r: r.get("seed_identical"), _seed, ""),
        ("two", "two-sample test", lambda r: r.get("dist_p"), _two, ""),
        ("model", "model test", lambda r: r.get("model_p"), _model, ""),
        ("verdict", "verdict", lambda r: rank.get(r.get("sampling_verdict"), 9), lambda r: r.get("sampling_verdict") or "n/a",
         "verdict"),
        ("need", "seeds to detect", lambda r: r.get("seeds_needed"), _need, "n"),
    ]


def explanation(layer: SamplingLayer) -> str:
    return (f"Each cell's seeded samples against its baseline's. Repeatable: the share of (prompt, seed) samples "
            f"identical between the cell's two passes. Seed by seed (the same engine on both sides, each repeating "
            f"its seeds): the share identical to the baseline's sample of the same seed, and where the others first "
            f"differ; 'not promised' where the engine's documentation does not promise it (seed_promises.py). "
            f"Two tests of the distribution: the two-sample test (a permutation of seeds on each sample's mean raw "
            f"logprob, centred per prompt, both sides' samples scored by the baseline's engine where it rescored "
            f"them after the run: n samples, the shift in nats/token) and the model test (each sampled token against "
            f"the baseline's teacher-forced distribution after the cell's own sampler: the mean of its randomized "
            f"PITs against U(0,1); where nothing was rescored, each prompt's first sampled token against the "
            f"baseline's next-token logprobs: G-tests with simulated nulls, Bonferroni over prompts), each at "
            f"{layer.alpha:g} / (tests run) (sampling_alpha, Bonferroni over the tests). The two-sample test sees the "
            f"distribution as served (model and sampler together), the model test the model under the cell's own "
            f"sampler: different where the model test finds a difference, or the two-sample test does and the "
            f"engines sample alike; "
            f"sampler differs where only the two-sample test does and the engines' samplers give another "
            f"distribution at these settings; not distinguishable where no test finds one but the two-sample test "
            f"could not have seen a shift of {layer.shift:g} nats/token (sampling_shift) with 80% power; else same "
            f"distribution (identical where every seed matched). Seeds to detect: seeds each side for the "
            f"two-sample test to find a shift of {layer.shift:g} nats/token with 80% power, and where no difference "
            f"was detected, ~how many would find a shift of the size observed.")


def rows(layer: SamplingLayer, cells: pd.DataFrame) -> list[dict]:
    """The layer's rows with each cell's config label (from the report's cells frame), worst first."""
    t = layer.table
    if t is None or t.empty:
        return []
    labels = cells.set_index("cell_id").get("config") if "config" in cells else None
    out = []
    for r in t.to_dict("records"):
        r["config"] = (labels.get(r["cell_id"]) if labels is not None else None) or \
            f"{r['framework']}/{r['model']}/{r['quantization']}/{r['flags']}"
        out.append(r)
    rank = {v: i for i, v in enumerate(SAMPLING_VERDICT_ORDER)}
    return sorted(out, key=lambda r: (rank.get(r.get("sampling_verdict"), 9), r["config"], r["batch_size"]))


def why(r: dict) -> str:
    return first_line(r.get("sampling_reason"), 600)
