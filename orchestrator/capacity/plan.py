"""Capacity planning from a run: which batch size, how many replicas and GPUs, at what cost.

    bench plan RUN --qps Q --input-len I --output-len O [--slo-ttft-p99 MS] [--slo-tpot-p99 MS]
                   [--gpu-hour-cost USD] [--max-replicas N]

Per measured engine config (engine_key: framework/model/quantization/flags), from its ok cells:

  batch      of the measured batch sizes whose TTFT p99 and TPOT p99 meet both SLOs (no SLO given:
             every measured batch), the cheapest: the fewest replicas for Q, then the most requests/s
             per replica (headroom), then the smaller batch. Not the largest: a larger batch can serve
             fewer requests/s (an engine that runs its batches one request after another, or whose
             latency grows faster than its batch). A config none of whose batches meets them is
             reported with the SLO(s) it misses and by how much, at its closest miss (the batch
             with the smallest relative overshoot).
  rate       requests/s per replica at that batch. Cells at the requested lengths: the measured
             `req_s` (rate_basis "measured req_s"). See "lengths" for the others.
  replicas   ceil(Q / rate); utilisation = Q / (replicas x rate) is the headroom left.
  GPUs       per replica: tensor_parallel_size x pipeline_parallel_size from the cell's flags or
             engine arguments, else 1. On a CPU run the unit is a "node": the measured host.
  cost       per million output tokens = GPUs x cost per hour / (3600 x output tok/s served) x 1e6,
             with output tok/s served = Q x O (the demand actually served, not the capacity bought).

Lengths: a config measured at exactly I/O uses those cells as measured. Otherwise the cells at
its closest measured lengths (smallest |ln I/I_m| + |ln O/O_m|) are *scaled* with a first-order
latency model, and the row says so (`scaled`, `lengths`):
  TTFT  x I / I_m                      (prefill grows with the prompt)
  TPOT  unchanged                      (one decode step per token; context growth ignored)
  rate  req_s_m x e2e(I_m, O_m) / e2e(I, O), e2e(i, o) = TTFT_p50 x i / I_m + (o - 1) x TPOT_p50
        (rate_basis "scaled req_s"); where TPOT is unknown (O_m = 1): output_tok_s_m / O
        ("output_tok_s / O": output tokens/s assumed not to depend on the lengths).
Scaled numbers are estimates: measure the config at I/O to plan on it.

Batch extrapolation: with --max-replicas N, a config that needs more than N replicas at its
batch needs each replica to serve Q / N requests/s. When its chosen batch is the largest measured
one, the batch that would give that rate is extrapolated along the secant of the two largest
measured batches (one batch measured: requests/s assumed proportional to the batch) and the row is
marked `extrapolated`: its SLOs and rate at that batch were never measured. When a larger measured
batch already misses an SLO, or throughput stops growing with the batch, the config cannot serve Q
with N replicas and says why.

Caveat: cells are static batches measured closed-loop, so queueing delay at Q is not modelled;
keep utilisation below 1 with some margin.

Served cells (mode serve, label ".../serve") plan from their closed-loop load points, batch_size
being the number of requests in flight; their open-loop rate cells measured the rate they were
offered, not what the server can do, and are left out.

SLO searches (serve.search): a configuration whose search found a maximum plans from it, when the
search ran at the plan's lengths and its SLOs are at least as strict as the plan's (each SLO the plan
gives, the search gave too, no looser): a replica serves the searched maximum rate (rate_basis
"searched max rate"; a concurrency search: the req/s measured at its maximum concurrency), with the
TTFT and TPOT p99 measured there. Otherwise the row says why the search was not used, and the
configuration's closed-loop cells (if any) are planned as above.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.judge import searches
from orchestrator.matrix.placement import engine_gpus
from orchestrator.store.run_store import RunStore
from orchestrator.store.schema import json_object
from orchestrator.values import finite

COLUMNS = ["config", "engine_key", "framework", "model", "quantization", "flags", "device", "unit",
           "measured_batches", "meets_slo", "batch_size", "extrapolated", "scaled", "lengths",
           "ttft_p99_ms", "tpot_p99_ms", "req_s_per_replica", "rate_basis", "output_tok_s_per_replica",
           "replicas", "gpus_per_replica", "gpus", "utilisation", "output_tok_s_served",
           "cost_per_m_tokens", "slo_miss", "notes"]




def gpus_per_replica(row: dict) -> tuple[int, str]:
    """(devices per replica, unit): tensor x pipeline parallel size on GPU (placement.engine_gpus, as the
    scheduler reserves them), 1 node on CPU."""
    if str(row.get("device") or "cpu") == "cpu":
        return 1, "node"
    return engine_gpus({**json_object(row.get("engine_args")), **json_object(row.get("flags_json"))}), "GPU"


def _config_label(r: dict) -> str:
    label = f"{r['framework']}/{r['model']}/{r['quantization']}/{r['flags']}"
    return label + "/serve" if r.get("mode") == "serve" else label


def _estimate(c: dict, input_len: int, output_len: int, scaled: bool) -> dict:
    """One cell's numbers at the requested lengths: as measured, or scaled (module docstring)."""
    if not scaled:
        return {"ttft_p99": c["ttft_ms_p99"], "tpot_p99": c["tpot_ms_p99"], "req_s": c["req_s"],
                "basis": "measured req_s"}
    fi = input_len / c["input_len"]
    e2e_m = c["ttft_ms_p50"] + (c["output_len"] - 1) * c["tpot_ms_p50"]
    e2e = c["ttft_ms_p50"] * fi + (output_len - 1) * c["tpot_ms_p50"]
    if finite(e2e_m) and finite(e2e) and e2e_m > 0 and e2e > 0:
        req_s, basis = c["req_s"] * e2e_m / e2e, "scaled req_s"
    else:
        req_s, basis = c["output_tok_s"] / output_len, "output_tok_s / O"
    return {"ttft_p99": c["ttft_ms_p99"] * fi, "tpot_p99": c["tpot_ms_p99"], "req_s": req_s, "basis": basis}


def _misses(est: dict, slo_ttft: float | None, slo_tpot: float | None) -> list[tuple[str, float, float]]:
    """[(name, value, slo)] of the SLOs this estimate misses; an unmeasured metric misses its SLO."""
    out = []
    for name, v, slo in (("TTFT p99", est["ttft_p99"], slo_ttft), ("TPOT p99", est["tpot_p99"], slo_tpot)):
        if slo is not None and not (finite(v) and v <= slo):
            out.append((name, v, slo))
    return out


def _miss_text(misses: list[tuple[str, float, float]]) -> str:
    parts = []
    for name, v, slo in misses:
        if not finite(v):
            parts.append(f"{name} not measured (SLO {slo:g} ms)")
        else:
            pct = (v / slo - 1) * 100
            parts.append(f"{name} {v:.1f} ms > SLO {slo:g} ms by {v - slo:.1f} ms (+{pct:.0f}%)" if pct >= 10 else
                         f"{name} {v:.1f} ms > SLO {slo:g} ms by {v - slo:.2g} ms (+{pct:.2g}%)")
    return "; ".join(parts)


def _closest_lengths(lengths: set[tuple[int, int]], input_len: int, output_len: int) -> tuple[int, int]:
    return min(lengths, key=lambda lo: (abs(math.log(input_len / lo[0])) + abs(math.log(output_len / lo[1])),
                                        -lo[0], -lo[1]))


def plan(run_dir: str | Path, qps: float, input_len: int, output_len: int,
         slo_ttft_p99_ms: float | None = None, slo_tpot_p99_ms: float | None = None,
         gpu_hour_cost: float | None = None, max_replicas: int | None = None) -> pd.DataFrame:
    """One row per engine config of the run (COLUMNS); see the module docstring for the model."""
    if not qps > 0:
        raise ValueError(f"qps must be > 0, got {qps}")
    if input_len < 1 or output_len < 1:
        raise ValueError("input and output lengths must be >= 1")
    if max_replicas is not None and max_replicas < 1:
        raise ValueError("max_replicas must be >= 1")
    cells = RunStore(run_dir).read_cells()
    found = searches.summaries(cells)
    # a served open-loop cell measured the rate it was offered, not what the server can do; an SLO
    # search's probes are read through its own row
    cells = cells[~((cells["mode"] == "serve") & (cells["request_rate"] != np.inf)) | cells.cell_id.isin(found.cell_id)]
    if cells.empty:
        return pd.DataFrame(columns=COLUMNS)
    derived = cells[["framework", "model", "quantization", "flags"]].astype(str).agg("/".join, axis=1)
    cells["engine_key"] = cells["engine_key"].where(cells["engine_key"].notna(), derived)

    rows = []
    for key, grp in cells.groupby("engine_key", sort=False):
        rows.append(_plan_config(grp.to_dict("records"), qps, input_len, output_len, slo_ttft_p99_ms,
                                 slo_tpot_p99_ms, gpu_hour_cost, max_replicas) | {"engine_key": key})
    df = pd.DataFrame(rows, columns=COLUMNS).astype(
        {"batch_size": "Int64", "replicas": "Int64", "gpus": "Int64", "gpus_per_replica": "Int64",
         "meets_slo": bool, "extrapolated": bool, "scaled": bool,
         **{c: float for c in ("ttft_p99_ms", "tpot_p99_ms", "req_s_per_replica", "output_tok_s_per_replica",
                                "utilisation", "output_tok_s_served", "cost_per_m_tokens")}})
    order = df.assign(_m=~df.meets_slo, _g=df.gpus.astype(float).fillna(np.inf),
                      _r=-df.req_s_per_replica.fillna(0))
    return df.loc[order.sort_values(["_m", "_g", "_r", "config"]).index].reset_index(drop=True)


def _plan_config(all_cells: list[dict], qps: float, input_len: int, output_len: int,
                 slo_ttft: float | None, slo_tpot: float | None, cost: float | None,
                 max_replicas: int | None) -> dict:
    first = all_cells[0]
    row: dict[str, Any] = {c: None for c in COLUMNS}
    row.update(config=_config_label(first), framework=first["framework"], model=first["model"],
               quantization=first["quantization"], flags=first["flags"], device=first.get("device"),
               meets_slo=False, extrapolated=False, scaled=False, notes="")
    searched = [c for c in all_cells if isinstance(c.get("search_id"), str)]
    all_cells = [c for c in all_cells if not isinstance(c.get("search_id"), str)]
    why_not = []
    for c in sorted(searched, key=lambda c: -(c.get("search_max") or 0)):
        why = _search_unusable(c, input_len, output_len, slo_ttft, slo_tpot)
        if why is None:
            return _plan_from_search(row, c, qps, output_len, cost, max_replicas)
        why_not.append(why)
    if why_not:
        row["notes"] = "SLO search not used: " + "; ".join(why_not)
    if not all_cells:
        row["slo_miss"] = "no closed-loop cell to plan from, and no SLO search that answers this plan"
        return row
    ok = [c for c in all_cells if c["status"] == "ok" and finite(c["req_s"]) and c["req_s"] > 0
          and finite(c["input_len"]) and finite(c["output_len"])]
    if not ok:
        statuses = sorted({str(c["status"]) for c in all_cells})
        row["slo_miss"] = "no ok cell to plan from (status: " + ", ".join(statuses) + ")"
        return row
    row["device"] = ok[0].get("device")
    gpr, unit = gpus_per_replica(ok[0])
    row.update(gpus_per_replica=gpr, unit=unit)

    lengths = {(int(c["input_len"]), int(c["output_len"])) for c in ok}
    lm = (input_len, output_len) if (input_len, output_len) in lengths else _closest_lengths(lengths, input_len, output_len)
    scaled = lm != (input_len, output_len)
    at = sorted((c for c in ok if (int(c["input_len"]), int(c["output_len"])) == lm),
                key=lambda c: (int(c["batch_size"]), -c["req_s"]))
    row.update(scaled=scaled, lengths=(f"scaled from in={lm[0]}/out={lm[1]}" if scaled else "measured"),
               measured_batches=",".join(str(b) for b in sorted({int(c["batch_size"]) for c in at})))
    notes = [row["notes"]] if row["notes"] else []
    if any(c.get("batch_mode") == "sequential" for c in at):
        notes.append("engine ran its batches sequentially")

    ests = [(c, _estimate(c, input_len, output_len, scaled)) for c in at]
    passing = [(c, e) for c, e in ests if not _misses(e, slo_ttft, slo_tpot)]
    if not passing:
        def overshoot(ce):
            return max((v / slo if finite(v) else math.inf) for _, v, slo in _misses(ce[1], slo_ttft, slo_tpot))
        c, e = min(ests, key=overshoot)
        row.update(slo_miss=f"at batch {int(c['batch_size'])} (closest miss): " + _miss_text(_misses(e, slo_ttft, slo_tpot)),
                   ttft_p99_ms=e["ttft_p99"], tpot_p99_ms=e["tpot_p99"], notes="; ".join(notes))
        return row

    # the cheapest batch meeting both SLOs: fewest replicas, then most requests/s, then the smaller batch
    chosen, est = min(passing, key=lambda ce: (math.ceil(qps / ce[1]["req_s"] - 1e-9), -ce[1]["req_s"],
                                               int(ce[0]["batch_size"])))
    batch, rate = int(chosen["batch_size"]), float(est["req_s"])
    row.update(meets_slo=True, batch_size=batch, ttft_p99_ms=est["ttft_p99"], tpot_p99_ms=est["tpot_p99"],
               rate_basis=est["basis"])
    replicas = math.ceil(qps / rate - 1e-9)
    max_b = int(at[-1]["batch_size"])
    if batch < max_b:
        c_next, e_next = next((c, e) for c, e in ests if int(c["batch_size"]) > batch)
        missed = _misses(e_next, slo_ttft, slo_tpot)
        notes.append(f"batch {int(c_next['batch_size'])}: " + (_miss_text(missed) if missed else
                     f"meets the SLOs at {e_next['req_s']:.3g} req/s: {math.ceil(qps / e_next['req_s'] - 1e-9)} "
                     f"replica(s), not {replicas}"))

    if max_replicas is not None and replicas > max_replicas:
        need = qps / max_replicas
        if batch < max_b:
            row.update(meets_slo=False, slo_miss=(
                f"{max_replicas} replica(s) need {need:.3g} req/s each; batch {batch} gives {rate:.3g}, the most "
                f"of the batches meeting the SLOs, and the larger measured batch {int(c_next['batch_size'])} "
                + ("misses an SLO" if missed else "gives less")))
            row["notes"] = "; ".join(notes)
            return row
        pts = sorted({int(c["batch_size"]): e["req_s"] for c, e in ests}.items())
        if len(pts) == 1:
            b_need = math.ceil(batch * need / rate - 1e-9)
            notes.append("one batch size measured: requests/s assumed proportional to the batch")
        else:
            (b0, r0), (b1, r1) = pts[-2], pts[-1]
            slope = (r1 - r0) / (b1 - b0)
            if slope <= 0:
                row.update(meets_slo=False, slo_miss=(
                    f"{max_replicas} replica(s) need {need:.3g} req/s each; batch {batch} gives {rate:.3g} "
                    f"and requests/s did not grow from batch {b0} to {b1}"))
                row["notes"] = "; ".join(notes)
                return row
            b_need = math.ceil(b1 + (need - r1) / slope - 1e-9)
        notes.append(f"extrapolated: needs batch {b_need} (measured up to {max_b}); SLOs and rate there unmeasured")
        row.update(extrapolated=True, batch_size=b_need)
        rate, replicas = need, max_replicas

    gpus = replicas * gpr
    served = qps * output_len
    row.update(req_s_per_replica=rate, output_tok_s_per_replica=rate * output_len, replicas=replicas,
               gpus=gpus, utilisation=qps / (replicas * rate), output_tok_s_served=served,
               cost_per_m_tokens=(gpus * cost / (3600 * served) * 1e6) if cost is not None else None,
               notes="; ".join(notes))
    return row


def _search_unusable(c: dict, input_len: int, output_len: int, slo_ttft: float | None,
                     slo_tpot: float | None) -> str | None:
    """Why a configuration's SLO search cannot answer this plan (None: it can)."""
    slos = json_object(c.get("search_slos"))
    if c["status"] != "ok":
        return f"the search's status is {c['status']}"
    if not finite(c.get("search_max")):
        return f"no load met its SLOs ({c.get('search_missed') or 'see the search'})"
    if (int(c["input_len"]), int(c["output_len"])) != (input_len, output_len):
        return f"searched at in={int(c['input_len'])}/out={int(c['output_len'])}, not the plan's lengths"
    for name, mine in (("ttft_p99_ms", slo_ttft), ("tpot_p99_ms", slo_tpot)):
        theirs = slos.get(name)
        if mine is not None and (theirs is None or theirs > mine):
            return (f"the plan's {name.replace('_p99_ms', ' p99').upper()} SLO {mine:g} ms is stricter than the "
                    f"search's ({'none' if theirs is None else f'{theirs:g} ms'})")
    return None


def _plan_from_search(row: dict, c: dict, qps: float, output_len: int, cost: float | None,
                      max_replicas: int | None) -> dict:
    """A replica serves the searched maximum: the highest request rate that met the search's SLOs (a
    concurrency search: the requests/s measured at the highest concurrency that met them)."""
    slos = json_object(c.get("search_slos"))
    rate_search = c.get("search_variable") == "rate"
    rate = float(c["search_max"]) if rate_search else float(c["req_s"])
    gpr, unit = gpus_per_replica(c)
    stated = ", ".join(f"{k.replace('_p99_ms', ' p99')} <= {v:g} ms" for k, v in slos.items()
                       if k.endswith("_p99_ms") and v is not None)
    if slos.get("goodput"):
        stated += f", goodput >= {slos['goodput']:g}"
    notes = [f"searched ({stated}; judged by the {slos.get('judge', 'point')} p99): max "
             + (f"{rate:g} req/s" if rate_search else f"concurrency {c['search_max']:g}")
             + (f", first miss at {c['search_fail']:g}: {c.get('search_missed')}" if finite(c.get("search_fail"))
                else ", no probe up to the search's high bound missed")]
    row.update(meets_slo=True, batch_size=int(c["search_max"]) if not rate_search else int(c["batch_size"]),
               measured_batches=f"search ({int(c['search_probes'])} probes)", lengths="measured",
               ttft_p99_ms=c.get("ttft_ms_p99"), tpot_p99_ms=c.get("tpot_ms_p99"), gpus_per_replica=gpr, unit=unit,
               device=c.get("device"),
               rate_basis="searched max rate" if rate_search else "req_s at searched max concurrency")
    replicas = math.ceil(qps / rate - 1e-9)
    if max_replicas is not None and replicas > max_replicas:
        row.update(meets_slo=False, slo_miss=(f"{max_replicas} replica(s) need {qps / max_replicas:.3g} req/s each; "
                                              f"the searched maximum is {rate:.3g} req/s"), notes="; ".join(notes))
        return row
    gpus, served = replicas * gpr, qps * output_len
    row.update(req_s_per_replica=rate, output_tok_s_per_replica=rate * output_len, replicas=replicas, gpus=gpus,
               utilisation=qps / (replicas * rate), output_tok_s_served=served,
               cost_per_m_tokens=(gpus * cost / (3600 * served) * 1e6) if cost is not None else None,
               notes="; ".join(notes))
    return row
