"""The terminal: the consoles `bench` prints on and every table it draws there (bench validate,
show, run, ls, compare, plan); print_table prints a large one as plain columns."""

from __future__ import annotations

import os
import re
import sys
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from orchestrator.matrix.cells import load_label
from orchestrator.values import as_text
from orchestrator.report.data import q_text, speed_q_text

if TYPE_CHECKING:
    import pandas as pd

# rich falls back to 80 columns when not on a terminal (CI logs, pipes): 180 there, or COLUMNS where it asks for
# more. Never fewer: a parent that loaded GNU readline (pytest does) exports COLUMNS=80 to every child, which
# would fold the lines scripts read
_columns = os.environ.get("COLUMNS", "")
_width = None if Console().is_terminal else max(180, int(_columns) if _columns.isdigit() else 0)
out = Console(width=_width)
err = Console(stderr=True, width=_width)


RICH_ROWS = 2000  # above this a table prints as plain aligned text: rich lays out ~2 ms a row (100k: minutes)
_STYLED = re.compile(r"\[[a-z][a-z ]*\]([^\[]*)\[/[a-z ]*\]")   # one styled span, the common case


def plain_failure(e: BaseException) -> tuple[str, int] | None:
    """The one `error:` line and exit code of a failure that is no bug in bench (anywhere in the exception's
    chain): a full disk (3), an error that carries its own `bench_exit_code` (stored data that does not
    verify: 4; a local cluster that did not start: 3). None: a bug, whose traceback is the report."""
    import errno

    seen, depth = e, 0
    while seen is not None and depth < 10:
        if isinstance(seen, OSError) and (seen.errno in (errno.ENOSPC, errno.EDQUOT)
                                          or "No space left on device" in str(seen)):
            where = f" writing {seen.filename}" if getattr(seen, "filename", None) else ""
            return (f"disk full{where} ({seen.strerror or seen}): free space (or give --run-dir on another disk) and run "
                    f"the same command again; a run resumes with every cell stored so far", 3)
        if isinstance(getattr(seen, "bench_exit_code", None), int):
            return str(seen), seen.bench_exit_code
        seen, depth = seen.__cause__ or seen.__context__, depth + 1
    return None


def print_table(table: Table) -> None:
    """A rich table to stdout; a large one as plain columns (same cells, markup dropped, no wrapping)."""
    if table.row_count <= RICH_ROWS:
        out.print(table)
        return
    from rich.text import Text

    def plain(cell) -> str:
        text = cell.plain if isinstance(cell, Text) else str(cell)
        if "[/" in text and not isinstance(cell, Text):   # markup ("[green]ok[/]"); "[1.2, 1.4]" stays as it is
            whole = _STYLED.fullmatch(text)
            text = whole.group(1) if whole else Text.from_markup(text).plain
        return text.replace("\n", " ")

    cols = [[str(c.header)] + [plain(x) for x in c.cells] for c in table.columns]
    widths = [max(map(len, col)) for col in cols[:-1]] + [0]   # the last column (a reason) runs on
    just = [str.rjust if c.justify == "right" else str.ljust for c in table.columns]
    lines = [str(table.title or "")] if table.title else []
    for i in range(len(cols[0])):
        lines.append("  ".join(j(col[i], w) for col, w, j in zip(cols, widths, just)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * max(w, len(col[0])) for col, w in zip(cols, widths)))
    sys.stdout.write("\n".join(lines) + "\n")


def _fmt(v, spec: str = ".1f") -> str:
    if v is None or v != v:  # None or NaN (pandas turns missing numbers into NaN)
        return "-"
    return format(v, spec)


def _rate(rate) -> str:
    """A serve cell's request rate: 'inf' is a closed loop; an offline cell has none."""
    if rate is None or rate != rate:
        return "-"
    return "closed" if rate == float("inf") else f"{rate:g}/s"


def _has_workloads(df) -> bool:
    """Cells of named workloads (matrix workloads): the tables then name each cell's workload."""
    return "workload" in df and df["workload"].notna().any()


def _workload(r) -> str:
    v = r.get("workload") if isinstance(r, dict) else getattr(r, "workload", None)
    return escape(v) if isinstance(v, str) else "-"


def _flags(r) -> str:
    """The flag set, and ' env NAME' for a cell of a named engine environment (matrix envs)."""
    get = r.get if isinstance(r, dict) else lambda k: getattr(r, k, None)
    env = get("env")
    return f"{get('flags')}" + (f" env {env}" if isinstance(env, str) else "")


def _config(r: dict) -> str:
    """framework/model/quantization/flags (' env NAME'), and ' [workload]' for a cell of a named workload."""
    wl = r.get("workload")
    # escaped: rich would read '[name]' as markup
    return escape(f"{r['framework']}/{r['model']}/{r['quantization']}/{_flags(r)}"
                  + (f" [{wl}]" if isinstance(wl, str) else ""))


def host_busy_label(r: dict) -> str:
    """How many of a cell's timed repeats the rest of the host disturbed (adapters/contract/disturbance.py), and
    the largest share of the engine cores' time (or GPU) other processes took in one: '2/6 48%'; '-' unmeasured."""
    from orchestrator.judge.speed import disturbed_repeats

    cpu, gpu = r.get("host_busy_runs"), r.get("gpu_busy_runs")
    counted = disturbed_repeats(cpu, gpu)
    if counted is None:
        return "-"
    top = max(float(v) for x in (cpu, gpu) if x is not None and hasattr(x, "__len__") for v in x)
    return f"{counted[0]}/{counted[1]} {top:.0%}"


def _telemetry_columns(df) -> list[str]:
    """The engine-telemetry and energy columns a table shows: only where some cell measured them."""
    return [name for name, col in (("prefix hit", "prefix_cache_hit_rate"), ("preempt", "preemptions"),
                                   ("KV max", "kv_cache_usage_max"), ("queue max", "requests_waiting_max"),
                                   ("J/tok", "energy_j_per_token"))
            if col in df and df[col].notna().any()]


def _telemetry_cell(r, name: str) -> str:
    v = getattr(r, name, None) if not isinstance(r, dict) else r.get(name)
    if v is None or v != v:
        return "-"
    return {"prefix_cache_hit_rate": "{:.0%}", "preemptions": "{:.0f}", "kv_cache_usage_max": "{:.0%}",
            "requests_waiting_max": "{:.0f}", "energy_j_per_token": "{:.3g}"}[name].format(v)


_TELEMETRY = {"prefix hit": "prefix_cache_hit_rate", "preempt": "preemptions", "KV max": "kv_cache_usage_max",
              "queue max": "requests_waiting_max", "J/tok": "energy_j_per_token"}


def summary_table(df, title: str) -> Table:
    """`bench show` and `bench run`: the measured numbers of every cell, one row each; the engine's
    prefix-cache hit rate (and the other telemetry, and energy) beside TTFT where measured."""
    table = Table(title=title)
    serve = "mode" in df and (df["mode"] == "serve").any()
    extra = _telemetry_columns(df)
    named = _has_workloads(df)
    for col in ("framework", "model", "quant", "flags", "workload" if named else None, "mode" if serve else None,
                "batch" if not serve else "load",
                "status", "load s", "TTFT p50 ms", *extra, "TPOT p50 ms", "e2e p50 ms", "out tok/s", "peak MiB",
                "host busy", "errors" if serve else None, "reason"):
        if col:
            table.add_column(col, overflow="fold")
    df = df.sort_values(["framework", "model", "quantization", "flags", *(["workload"] if named else []),
                         *(["env"] if "env" in df else []), "mode", "batch_size", "request_rate"], na_position="first")
    for r in df.itertuples():
        color = "green" if r.status == "ok" else ("yellow" if r.status == "unsupported" else "red")
        reason = r.reason.splitlines()[0][:80] if isinstance(r.reason, str) and r.reason else ""
        head = [r.framework, r.model, r.quantization, _flags(r)] + ([_workload(r)] if named else []) + (
            [r.mode, load_label(r.mode, r.batch_size, r.request_rate, r.load)] if serve else [str(r.batch_size)])
        tail = [_fmt(r.errors, ".0f")] if serve else []
        table.add_row(*head,
                      f"[{color}]{r.status}[/{color}]", _fmt(r.load_s, ".2f"), _fmt(r.ttft_ms_p50, ".2f"),
                      *[_telemetry_cell(r, _TELEMETRY[c]) for c in extra], _fmt(r.tpot_ms_p50, ".2f"), _fmt(r.e2e_ms_p50, ".1f"), _fmt(r.output_tok_s),
                      _fmt(r.peak_mem_bytes / 2**20, ".0f"), host_busy_label(r._asdict()), *tail,
                      reason)
    return table


def matrix_table(title: str, cells: list) -> Table:
    """`bench validate`: the expanded cells of a matrix."""
    table = Table(title=title)
    named = any(c.workload for c in cells)
    for col in ("cell_id", "framework", "model", "quant", "flags", "workload" if named else None, "mode", "batch",
                "rate", "in", "out"):
        if col:
            table.add_column(col)
    for c in cells:
        table.add_row(c.cell_id, c.framework, c.model, c.quantization, _flags({"flags": c.flags, "env": c.env}),
                      *([escape(c.workload)] if named else []),
                      c.mode, str(c.batch_size), "search" if c.search else _rate(c.request_rate), str(c.input_len),
                      str(c.output_len))
    return table


def runs_table(runs: pd.DataFrame, title: str) -> Table:
    """`bench ls`: one row per run of orchestrator.store.runs.list_runs."""
    table = Table(title=title)
    for col in ("run", "matrix", "ok/total", "frameworks", "started", "ended"):
        table.add_column(col, overflow="fold")
    for r in runs.to_dict("records"):
        total = max(r["planned"], r["stored"])
        color = "green" if r["ok"] == total and total else "yellow" if r["ok"] else "red"
        ok = f"[{color}]{r['ok']}/{total}[/{color}]" + (f" ({total - r['stored']} not run)" if r["stored"] < total else "")
        table.add_row(r["run"], r["matrix"] or "-", ok, r["frameworks"] or "-", (r["started"] or "-")[:19],
                      (r["ended"] or "not ended")[:19])
    return table


_STYLE = {"identical": "bold green", "lossless": "green", "near-lossless": "yellow", "lossy": "bold red", "n/a": "dim"}
_TASK_STYLE = {"no change": "green", "not distinguishable": "yellow", "improved": "cyan", "regressed": "bold red",
               "n/a": "dim"}


def _task_cell(r: dict) -> str:
    v = r.get("task_verdict")
    return f"[{_TASK_STYLE[v]}]{v}[/]" if isinstance(v, str) else ""


def compare_table(df: pd.DataFrame) -> Table:
    """`bench compare`: the verdicts with the key metrics and the speed next to them, one row per cell."""
    from orchestrator.values import finite  # lazy: duckdb and pandas stay out of bench's startup

    def num(v, spec=".2g") -> str:
        return "" if not finite(v) else format(v, spec)

    serve = "mode" in df and (df["mode"] == "serve").any()
    t = Table(title="Lossless comparison", show_lines=False)
    # the task and sampling columns only where the run has those layers: a narrow terminal keeps its width
    layers = [name for name, col in (("tasks", "task_verdict"), ("sampling", "sampling_verdict"))
              if col in df and df[col].notna().any()]
    # where the engine counted prefix-cache hits, TTFT beside the hit rate: what explains a TTFT saving
    # (the other telemetry is in bench show: this table is wide already)
    extra = [c for c in _telemetry_columns(df) if c in ("prefix hit", "J/tok")]
    ttft = ["TTFT p50 ms"] if "prefix hit" in extra else []
    named = ["workload"] if _has_workloads(df) else []
    for col in ("framework", "model", "quant", "flags", *named, "load" if serve else "batch", "verdict", "kl_mean", "max_abs",
                "noise", "top1", "greedy", "ppl_rel", *layers, "speedup [95% CI] call", *ttft, *extra, "mem saved",
                "reason"):
        t.add_column(col, justify="right" if col not in ("verdict", "tasks", "sampling", "reason", "framework", "model",
                                                         "flags", "workload", "load") else "left", overflow="fold",
                     no_wrap=col == "load")   # a load point reads whole ("poisson 8/s, c<=4"), never folded
    for r in df.to_dict("records"):
        load = load_label(r["mode"], r["batch_size"], r["request_rate"], r.get("load")) if serve else str(r["batch_size"])
        call = r.get("speed_call") if isinstance(r.get("speed_call"), str) else ""   # None or NaN: no interval
        if call == "cannot judge" and isinstance(r.get("speed_reason"), str):   # the host was busy
            call += f" ({r['speed_reason']})"
        speed = "" if not finite(r["speedup"]) else \
            f"{r['speedup']:.2f}x [{num(r['speedup_lo'], '.2f')}, {num(r['speedup_hi'], '.2f')}] " \
            f"{speed_q_text(r) if call else ''}{call}".rstrip()
        greedy = "" if not finite(r["greedy_match"]) else f"{r['greedy_match']:.2f}/{r['greedy_close']:.2f}"
        t.add_row(str(r["framework"]), str(r["model"]), str(r["quantization"]), _flags(r),
                  *[_workload(r) for _ in named], load,
                  f"[{_STYLE[r['verdict']]}]{r['verdict']}[/]", num(r["kl_mean"]), num(r["max_abs"]),
                  num(r["noise_max_abs"]), num(r["top1"], ".3f"), greedy, num(r["ppl_rel"], "+.2g"),
                  *[{"tasks": _task_cell, "sampling": _sampling_cell}[name](r) for name in layers],
                  speed, *[_fmt(r.get("ttft_ms_p50"), ".2f") for _ in ttft],
                  *[_telemetry_cell(r, _TELEMETRY[c]) for c in extra], num(r["mem_saving"], ".0%"), str(r["verdict_reason"]))
    return t


def _sampling_cell(r: dict) -> str:
    v = r.get("sampling_verdict")
    return f"[{_SAMPLING_STYLE[v]}]{v}[/]" if isinstance(v, str) else ""


def task_table(tv: pd.DataFrame) -> Table:
    """`bench compare`: the task layer, one row per cell and task: the metric with its interval, and the
    paired change against the baseline with its interval, test and p-value."""
    from orchestrator.values import finite

    def ci(r, name: str, spec: str) -> str:
        v, lo, hi = r.get(name), r.get(f"{name}_lo"), r.get(f"{name}_hi")
        if not finite(v):
            return ""
        return f"{format(v, spec)} [{format(lo, spec)}, {format(hi, spec)}]" if finite(lo) and finite(hi) \
            else format(v, spec)

    t = Table(title="Task layer (item by item against the baseline)", show_lines=False)
    for col in ("configuration", "batch", "task", "metric", "n", "score [95% CI]", "baseline", "change [95% CI]",
                "ratio [95% CI]", "test", "p", "q", "verdict"):
        t.add_column(col, justify="left" if col in ("configuration", "task", "metric", "test", "verdict") else "right",
                     overflow="fold")
    for r in tv.to_dict("records"):
        test = {"mcnemar-exact": "McNemar exact", "paired-bootstrap": "paired bootstrap",
                "paired-permutation": "paired permutation"}.get(r.get("test"), "")
        judged = r["task_verdict"] != "n/a"
        t.add_row(f"{r['framework']}/{r['quantization']}/{r['flags']}" + ("" if r["mode"] == "offline" else f" {r['mode']}"),
                  str(r["batch_size"]), str(r["task"]), str(r.get("metric") or ""),
                  str(int(r["n"])) if finite(r.get("n")) else "", ci(r, "score", ".3f"),
                  format(r["base_score"], ".3f") if judged else "", ci(r, "change", "+.3f") if judged else "",
                  ci(r, "ratio", ".3f") if judged else "", test, format(r["p_value"], ".3g") if judged else "",
                  q_text(r), _task_cell(r) + ("" if judged else f" {r['task_reason']}"))
    return t


_SAMPLING_STYLE = {"identical": "bold green", "same distribution": "green", "not distinguishable": "yellow",
                   "sampler differs": "magenta", "different": "bold red", "n/a": "dim"}


def sampling_table(sv: pd.DataFrame) -> Table:
    """`bench compare`: the sampling layer, one row per cell with samples."""
    from orchestrator.values import finite

    t = Table(title="Sampling layer (seeded samples against the baseline)", show_lines=False)
    for col in ("configuration", "batch", "samples", "repeatable", "seed by seed", "shift nats/tok", "p",
                "model test p", "verdict", "seeds to detect", "why"):
        t.add_column(col, justify="right" if col in ("batch", "samples", "repeatable", "shift nats/tok", "p",
                                                     "model test p", "seeds to detect") else "left", overflow="fold")
    for r in sv.to_dict("records"):
        seed = r.get("seed_verdict") or "n/a"
        if seed != "n/a" and finite(r.get("seed_identical")):
            seed = f"{r['seed_identical']:.0%} identical"
        v = r.get("sampling_verdict") or "n/a"
        t.add_row(f"{r['framework']}/{r['quantization']}/{r['flags']}", str(r["batch_size"]), str(r.get("samples_n", "")),
                  f"{r['repeatable']:.0%}" if finite(r.get("repeatable")) else "",
                  seed, format(r["dist_shift"], "+.4f") if finite(r.get("dist_shift")) else "",
                  format(r["dist_p"], ".3g") if finite(r.get("dist_p")) else "",
                  _model_p(r),
                  f"[{_SAMPLING_STYLE[v]}]{v}[/]",
                  str(int(r["seeds_needed"])) if finite(r.get("seeds_needed")) else "", _sampling_why(r, v))
    return t


def _model_p(r: dict) -> str:
    """The model test's p: every sampled token (the baseline's engine rescored them), else the first token."""
    from orchestrator.values import finite

    if finite(r.get("whole_p")):
        return f"{r['whole_p']:.3g} (n {int(r['whole_n'])})"
    return f"{r['first_p']:.3g} (1st, n {int(r['first_n'])})" if finite(r.get("first_p")) else "n/a"


def _sampling_why(r: dict, verdict: str) -> str:
    """The sampling table's short why: what the verdict turns on."""
    if verdict == "n/a":
        return str(r.get("sampling_reason") or "")
    if isinstance(r.get("settings_changed"), str):
        return f"asked to sample with {r['settings_changed']}"
    if verdict == "sampler differs":
        return str(r.get("sampler_note") or "")
    if verdict == "not distinguishable":
        return f"could see {r['dist_detectable']:.3g} nats/tok"
    return ""


def against_table(df: pd.DataFrame, new: str, old: str) -> Table:
    """`bench compare NEW --against OLD`: per pair, the verdict of NEW against OLD and the speed ratios
    NEW/OLD with their 95% intervals and calls (what changed is listed below it: `changes_lines`)."""
    from orchestrator.values import finite  # lazy: duckdb and pandas stay out of bench's startup

    def ratio(r, name: str) -> str:
        v, lo, hi, call = (r.get(f"{name}_{x}") for x in ("ratio", "lo", "hi", "call"))
        if not finite(v):
            return ""
        ci = f" [{lo:.2f}, {hi:.2f}]" if finite(lo) and finite(hi) else " [no interval]"
        return f"x{v:.2f}{ci} {call if isinstance(call, str) else ''}".rstrip()

    t = Table(title=f"{new} against {old}", show_lines=False)
    layers = "task_verdict" in df and df["task_verdict"].notna().any()
    for col in ("configuration", "load", "verdict", *(["tasks"] if layers else []), "out tok/s", "TTFT p99", "TPOT p50",
                "peak mem", "reason"):
        t.add_column(col, justify="right" if col in ("out tok/s", "TTFT p99", "TPOT p50", "peak mem") else "left",
                     overflow="fold")
    for r in df.to_dict("records"):
        mem = f"x{r['mem_ratio']:.3f}" if finite(r.get("mem_ratio")) else ""
        t.add_row(_config(r), load_label(r["mode"], r["batch_size"], r["request_rate"], r.get("load")),
                  f"[{_STYLE[r['verdict']]}]{r['verdict']}[/]", *([_task_cell(r)] if layers else []), ratio(r, "tok_s"),
                  ratio(r, "ttft_p99"),
                  ratio(r, "tpot_p50"), mem, str(r["verdict_reason"]))
    return t


def changes_lines(df: pd.DataFrame) -> list[str]:
    """What changed between the paired cells, grouped: one line per distinct change, with its cells."""
    groups: dict[str, list[str]] = {}
    for r in df[df.changed.notna()].to_dict("records"):
        cell = f"{r['framework']}/{r['quantization']}/{r['flags']} " + load_label(r["mode"], r["batch_size"],
                                                                                 r["request_rate"], r.get("load"))
        for change in str(r["changed"]).split("; "):
            groups.setdefault(change, []).append(cell)
    return ["what changed:"] + [f"  {change}  ({len(cells)} cell(s): {', '.join(cells[:4])}"
                                f"{', ...' if len(cells) > 4 else ''})" for change, cells in groups.items()]


def env_pair_lines(pairs: pd.DataFrame) -> list[str]:
    """`bench compare` of a run with an env axis: per env pair, NEW/OLD output tok/s with its 95% interval, n
    and test, the call, and what differs between the two environments (orchestrator/judge/cross_run.py)."""
    from orchestrator.values import finite

    if pairs.empty:
        return []
    out = ["env pairs (output tok/s, the cell's env over its baseline's):"]
    for r in pairs.to_dict("records"):
        cell = f"{r['framework']}/{r['model']}/{r['quantization']}/{r['flags']} batch {r['batch_size']}"
        if finite(r["speedup_lo"]) and finite(r["speedup_hi"]):
            n = (f"n={int(r['speedup_n_cell'])} pairs" if r["speed_test"] == "paired t"
                 else f"n={int(r['speedup_n_cell'])}/{int(r['speedup_n_base'])}")
            speed = (f"{r['speedup']:.3f} [{r['speedup_lo']:.3f}, {r['speedup_hi']:.3f}] {n}, {r['speed_test']}: "
                     f"{r['speed_call']}" + (f" ({r['speed_reason']})" if isinstance(r.get("speed_reason"), str) else ""))
        else:
            speed = "no interval (fewer than 2 timed repeats on a side, or a side did not run)"
        out.append(f"  {cell}: {r['env']}/{r['baseline_env']} = {speed}")
        out += [f"    changed: {c}" for c in r["changed"]] or ["    changed: nothing recorded differs"]
    return out


def history_table(df: pd.DataFrame, title: str) -> Table:
    """`bench history`: per configuration, one line per run in order, with what changed since the last."""
    from orchestrator.values import finite

    t = Table(title=title, show_lines=False)
    for col in ("configuration", "run", "started", "verdict", "out tok/s", "TTFT p50 ms", "KL mean", "changed"):
        t.add_column(col, justify="right" if col in ("out tok/s", "TTFT p50 ms", "KL mean") else "left",
                     overflow="fold")
    for _, g in df.groupby("cell_id", sort=False):
        for i, r in enumerate(g.to_dict("records")):
            name = (_config(r) + " " + load_label(r["mode"], r["batch_size"], r["request_rate"])) if i == 0 else ""
            t.add_row(name, str(r["run"]), str(r["started"] or "")[:19], f"[{_STYLE.get(r['verdict'], '')}]{r['verdict']}[/]",
                      _fmt(r["output_tok_s"]), _fmt(r["ttft_ms_p50"], ".2f"),
                      format(r["kl_mean"], ".2g") if finite(r["kl_mean"]) else "", str(r["changed"] or ""))
    return t


def plan_table(df: pd.DataFrame, qps: float, input_len: int, output_len: int, host: dict | None = None,
               gpu_hour_cost: float | None = None) -> Table:
    """`bench plan`: one row per engine config of orchestrator.capacity.plan.plan's frame."""
    from orchestrator.values import finite  # lazy: pandas stays out of bench's startup

    def num(v, spec: str) -> str:
        return format(v, spec) if finite(v) else "-"

    def txt(v) -> str:
        return v if isinstance(v, str) and v else ""

    units = set(df.unit.dropna())
    unit = "/".join(u + "s" for u in sorted(units, key=lambda u: u != "GPU")) if units else "GPUs"
    caption = [f"Q={qps:g} req/s, input {input_len}, output {output_len} tokens; served {qps * output_len:g} output tok/s."]
    if "node" in units and host:
        caption.append(f"1 node = the measured host ({host.get('cpu', '?')}, {host.get('cpu_count', '?')} CPUs).")
    caption.append("Static batches measured closed-loop: queueing at Q is not modelled.")
    if (df.rate_basis == "searched max rate").any():
        caption.append("A searched max rate was measured open-loop, at that rate, with its SLOs met there.")
    t = Table(title=f"Plan: Q={qps:g} req/s, in={input_len}, out={output_len}", caption=" ".join(caption))
    cost_col = f"$/M out tok (@${gpu_hour_cost:g}/h)" if gpu_hour_cost is not None else "$/M out tok"
    for col in ("config", "batches", "batch", "TTFT p99", "TPOT p99", "req/s/replica", "basis", "replicas", unit, "util",
                cost_col, "SLO / notes"):
        t.add_column(col, overflow="fold", min_width=24 if col == "SLO / notes" else None,
                     justify="left" if col in ("config", "basis", "SLO / notes") else "right")
    for r in df.to_dict("records"):
        flags = [f"[yellow]{r['lengths']}[/]"] if r["scaled"] else []
        flags += [txt(r["notes"])] if txt(r["notes"]) else []
        if r["meets_slo"]:
            status = "; ".join(flags) or "[green]meets SLOs[/]"
            batch = f"{int(r['batch_size'])}" + (" [yellow]extrapolated[/]" if r["extrapolated"] else "")
        else:
            status = "; ".join([f"[red]{txt(r['slo_miss'])}[/]"] + flags)
            batch = "-"
        t.add_row(r["config"], txt(r["measured_batches"]) or "-", batch, num(r["ttft_p99_ms"], ".1f"),
                  num(r["tpot_p99_ms"], ".2f"), num(r["req_s_per_replica"], ".3g"), txt(r["rate_basis"]) or "-",
                  num(r["replicas"], ".0f"), num(r["gpus"], ".0f"), num(r["utilisation"], ".0%"),
                  num(r["cost_per_m_tokens"], ".4g"), status)
    return t




def search_table(summaries: pd.DataFrame, probes: pd.DataFrame) -> Table:
    """`bench show` and `bench compare`: per searched configuration, the highest load meeting the SLOs,
    the first load above it that missed and what it missed (orchestrator/judge/searches.py)."""
    from orchestrator.judge import searches

    t = Table(title="SLO search: the highest load meeting every SLO")
    for col in ("config", "search", "SLOs (judge)", "max met", "first miss", "probes", "requests/probe", "missed there"):
        t.add_column(col, overflow="fold")
    for r in summaries.to_dict("records"):
        var = searches.variable(r)
        status = "" if r["status"] == "ok" else f"[red]{r['status']}[/] "
        t.add_row(f"{_config(r)} in={r['input_len']} out={r['output_len']}",
                  load_label(r["mode"], r["batch_size"], None, r.get("load")), searches.slos_text(r),
                  status + searches.load_text(var, r.get("search_max")), searches.load_text(var, r.get("search_fail")),
                  _fmt(r.get("search_probes"), ".0f"), searches.requests_per_probe(r["cell_id"], probes),
                  as_text(r.get("search_missed")))
    return t


def probe_table(probes: pd.DataFrame) -> Table:
    """Every probe of every search, in order: its load, its p99s with their intervals, and the call."""
    from orchestrator.judge import searches

    t = Table(title="SLO search probes: p99 \\[interval at serve.search.level] of each probe's n requests")
    for col in ("search", "#", "load", "n", "TTFT p99 ms", "TPOT p99 ms", "e2e p99 ms", "goodput", "meets", "missed"):
        t.add_column(col, overflow="fold")
    for r in probes.to_dict("records"):
        meets = "[green]yes[/]" if r["search_meets"] else "[red]no[/]"
        t.add_row(r["search_id"][:8], str(int(r["search_probe"])),
                  load_label(r["mode"], r["batch_size"], r["request_rate"], r.get("load")), _fmt(r.get("requests"), ".0f"),
                  searches.p99_text(r, "ttft_ms", "ttft_p99_ms"), searches.p99_text(r, "tpot_ms", "tpot_p99_ms"),
                  searches.p99_text(r, "e2e_ms", "e2e_p99_ms"), _fmt(r.get("goodput"), ".3f"), meets,
                  as_text(r.get("search_missed")))
    return t


def noise_line(df) -> str:
    source = df["run_noise"].dropna()
    if not len(source):
        return ("speed: cannot judge across runs (no run-to-run noise estimate): the repeats within each run do not "
                "see how two runs differ; --noise-run OLD_REPEAT, or earlier runs of these cells under --history, "
                "measure it")
    sd = df["tok_s_run_sd"].dropna()
    drift = f"{100 * (float(sd.iloc[0]) if len(sd) else 0.0):.1f}%"
    return f"speed intervals: repeats and the run-to-run drift measured from {source.iloc[0]} (tok/s log sd {drift})"


def print_searches(cells) -> None:
    """A run's searches (SLO and rate searches) and their probes, where it has any."""
    from orchestrator.judge import searches

    found = searches.summaries(cells)
    if len(found):
        probes = searches.probes(cells)
        print_table(search_table(found, probes))
        print_table(probe_table(probes))
