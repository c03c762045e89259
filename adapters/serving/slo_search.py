"""SLO search (serve.search): the highest load at which a server still meets every SLO given.

Within one server lifetime, probes of the same shape as a serve cell (`measure.repeats` timed runs of
`serve.requests` requests; the group's warm-up once, before the first probe) at loads chosen by:

  bracketing  `low` first (a miss there: no load meets), then up by `growth` (x4) per probe until a
              probe misses or `high` is reached (a meet at `high`: the maximum is at least `high`);
  bisection   between the highest load that met and the lowest that missed, at their geometric mean
              (rate) or integer midpoint (concurrency), until miss / met - 1 <= `resolution` (rate) or
              the two are adjacent integers (concurrency), or `max_probes` probes were made.

A probe meets when every planned request succeeded (an error, a timeout or a request the time limit
left unsent is a miss: the server did not serve that load) and every SLO holds (`judge`):
  point     the p99 as measured (numpy's linear interpolation of the probe's requests) <= its SLO, and
            goodput >= its floor; what vLLM's and AIPerf's sweeps compare.
  interval  the upper end of the p99's distribution-free `level` interval (order statistics,
            adapters.contract.intervals.quantile_interval) <= its SLO, and the lower end of goodput's Wilson
            interval >= its floor: "meets" only when the probe's requests show it with confidence. A p99
            needs 368 requests per probe before that upper end is finite (bench validate says so).
Every check is stored with both ends of its interval whatever the judge, so a point-judged probe
shows how little its p99 from N requests pins down.

Each probe becomes its own row (this module's `Probe`s, via <cell_id>.probes.json, written after
every probe so a crash keeps the probes before it); the search's own row summarises them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from adapters.contract.intervals import quantile_interval, wilson_interval
from adapters.contract.records import PROBES, CellRecord, Probe
from adapters.contract.specs import SearchSpec
from adapters.contract.timing import CellMetrics

# (the SLO's name in serve.search, the per-request figure it bounds, its label in messages)
P99_SLOS = (("ttft_p99_ms", "ttft_ms", "TTFT p99"), ("tpot_p99_ms", "tpot_ms", "TPOT p99"),
            ("e2e_p99_ms", "e2e_ms", "e2e p99"))


def checks(m: CellMetrics, s: SearchSpec) -> dict[str, dict]:
    """Each SLO the search states, checked on one probe: value, interval, SLO, met."""
    out = {}
    for key, figure, label in P99_SLOS:
        slo = getattr(s, key)
        if slo is None:
            continue
        values = getattr(m, figure)
        point = getattr(m, f"{figure}_p99")
        lo, hi = quantile_interval(values, 0.99, s.level)
        judged = point if s.judge == "point" else hi
        out[key] = {"label": label, "value": point, "lo": lo, "hi": hi, "slo": slo, "n": len(values),
                    "met": judged is not None and judged <= slo}
    failed = m.requests_planned - m.requests
    # a load the server cannot serve is a miss whatever the latencies of the requests that got through
    out["served"] = {"label": "served", "value": m.requests, "lo": None, "hi": None, "slo": m.requests_planned,
                     "n": m.requests_planned, "met": failed == 0}
    if s.goodput is not None:
        n = m.requests_planned
        good = round((m.goodput or 0.0) * n)
        lo, hi = wilson_interval(good, n, s.level)
        judged = m.goodput if s.judge == "point" else lo
        out["goodput"] = {"label": "goodput", "value": m.goodput, "lo": lo, "hi": hi, "slo": s.goodput, "n": n,
                          "met": judged is not None and judged >= s.goodput}
    return out


def missed_text(found: dict[str, dict], judge: str) -> str | None:
    """'TTFT p99 251.2 ms > 200 ms (95% interval 180.1-inf, n=32)' for each SLO missed; None if none."""
    parts = []
    for c in found.values():
        if c["met"]:
            continue
        if c["label"] == "served":
            parts.append(f"{c['n'] - c['value']} of {c['n']} requests failed or were not sent")
            continue
        if c["value"] is None:
            parts.append(f"{c['label']} not measured")
            continue
        goodput = c["label"] == "goodput"
        sign, unit, spec = ("<", "", ".3f") if goodput else (">", " ms", ".1f")
        basis = "" if judge == "point" else (" (its lower bound)" if goodput else " (its upper bound)")
        parts.append(f"{c['label']} {c['value']:{spec}}{unit} {sign} {c['slo']:g}{unit}{basis} "
                     f"(interval {c['lo']:{spec}}-{c['hi']:{spec}}, n={c['n']})")
    return "; ".join(parts) or None


def _stored_checks(found: dict[str, dict]) -> dict[str, dict]:
    """The checks as a row stores them: a figure that is not a finite number is null."""
    def num(v):
        return None if v is None or not math.isfinite(v) else v
    return {k: {**c, "value": num(c["value"]), "lo": num(c["lo"]), "hi": num(c["hi"])} for k, c in sorted(found.items())}


@dataclass
class Outcome:
    max_met: float | None
    first_miss: float | None
    missed: str | None
    notes: list[str]


def _next_load(s: SearchSpec, met: float | None, miss: float | None) -> float | None:
    """The next load to probe, or None when the search is done."""
    integer = s.variable == "concurrency"
    if met is None:
        return None if miss is not None else s.low
    if miss is None:
        if met >= s.high:
            return None
        up = met * s.growth
        return float(min(math.ceil(up) if integer else up, s.high))
    if integer:
        return None if miss - met <= 1 else float((int(met) + int(miss)) // 2)
    if miss / met - 1 <= s.resolution:
        return None
    mid = math.sqrt(met * miss)
    short = round(mid, 2 - math.floor(math.log10(mid)))   # 3 significant digits read better in tables
    return short if met < short < miss else mid


def search(s: SearchSpec, probe: Callable[[float], tuple[CellRecord, float | None, int]],
           probes_file: Path) -> tuple[Outcome, list[Probe]]:
    """Probes until done (module docstring). `probe(load)` measures one load point and returns its record
    (with the search's checks filled in here), its rate (None: closed loop) and its concurrency."""
    probes: list[Probe] = []
    met = miss = None
    missed = None
    while len(probes) < s.max_probes:
        load = _next_load(s, met, miss)
        if load is None:
            break
        record, rate, conc = probe(load)
        found = checks(record, s)
        record.search_variable, record.search_probe = s.variable, len(probes)
        record.search_meets = all(c["met"] for c in found.values())
        record.search_checks, record.search_missed = _stored_checks(found), missed_text(found, s.judge)
        probes.append(Probe(rate=rate, concurrency=conc, record=record))
        probes_file.write_bytes(PROBES.dump_json(probes))   # a crash keeps the probes made so far
        if record.search_meets:
            met = load
        else:
            miss, missed = load, record.search_missed
    notes = [f"SLO search over {s.variable} in [{s.low:g}, {s.high:g}]: {len(probes)} probes, judged by "
             f"{'the point p99' if s.judge == 'point' else f'the {s.level:.0%} interval'}"]
    if met is not None and miss is None:
        notes.append(f"the highest load probed ({met:g}) met every SLO: the maximum may be higher")
    if met is not None and miss is not None and _next_load(s, met, miss) is not None:
        notes.append(f"stopped at max_probes ({s.max_probes}) before the resolution was reached")
    return Outcome(met, miss, missed, notes), probes


def summary_record(s: SearchSpec, outcome: Outcome, probes: list[Probe]) -> CellRecord:
    """The search's own row: the figures of the probe at the maximum (null with the reason when none met)
    and the summary columns."""
    best = next((p for p in reversed(probes) if p.record.search_meets and _load(s, p) == outcome.max_met), None)
    if best is not None:
        rec = best.record.model_copy(deep=True)
        rec.notes = rec.notes + [f"figures of probe {best.record.search_probe}, the highest load that met the SLOs"]
    else:
        why = "no probe met the SLOs" if probes else "no probe was made"
        rec = CellRecord(requests=0, requests_planned=0, requests_sent=0, errors=0, errors_by_kind={},
                         output_tokens=0, prompt_tokens=None, output_tok_s=None, total_tok_s=None, req_s=None,
                         output_tok_s_runs=[], goodput=None, goodput_req_s=None, ttft_ms=[], tpot_ms=[], e2e_ms=[],
                         chunk_tokens_mean=None, itl_samples=0, engine_ttft_ms=None, engine_ttft_ms_p50=None,
                         engine_ttft_agrees=None, peak_mem_bytes=None, repeats=0,
                         missing={k: f"{why} (search_missed says what the lowest load missed)"
                                  for k in ("ttft_ms", "tpot_ms", "e2e_ms", "output_tok_s", "peak_mem_bytes")})
    rec.search_variable, rec.search_probe, rec.search_meets, rec.search_checks = s.variable, None, None, None
    rec.search_max, rec.search_fail, rec.search_missed = outcome.max_met, outcome.first_miss, outcome.missed
    rec.search_probes = len(probes)
    rec.search_slos = s.model_dump()
    rec.notes = rec.notes + outcome.notes
    if outcome.max_met is None:
        rec.missing["search_max"] = f"the lowest load probed ({s.low:g}) missed: {outcome.missed}"
    if outcome.first_miss is None:
        rec.missing["search_fail"] = f"no probe up to {s.high:g} missed an SLO"
    return rec


def _load(s: SearchSpec, p: Probe) -> float:
    return float(p.concurrency) if s.variable == "concurrency" else float(p.rate)

