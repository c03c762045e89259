"""The tables that fit a terminal: `bench compare` and `bench show` by default print one line per cell,
the verdict and the figures that decide it (`--wide`: every column, console.py's tables); `--format
csv|json|md` gives scripts the same rows: every column of the frame as CSV or JSON, or the table as a
Markdown pipe table."""

from __future__ import annotations

import io
import json
import re
import sys
from typing import TYPE_CHECKING

from rich import box
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from orchestrator.report.data import q_text, speed_q_text

from orchestrator.matrix.cells import load_label
from orchestrator.values import csv_safe, finite, md_page_inert

if TYPE_CHECKING:
    import pandas as pd

FORMATS = ("table", "csv", "json", "md")
_VERDICT = {"identical": "bold green", "lossless": "green", "near-lossless": "yellow", "lossy": "bold red", "n/a": "dim"}
_LAYER = {"no change": "green", "not distinguishable": "yellow", "improved": "cyan", "regressed": "bold red",
          "identical": "bold green", "same distribution": "green", "sampler differs": "magenta",
          "different": "bold red", "n/a": "dim"}
_PARTS = ("framework", "model", "quantization", "flags", "env", "workload", "load")


def _g(v, spec: str = ".2g") -> str:
    return format(v, spec) if finite(v) else ""


def _load(r: dict) -> str:
    return load_label(r.get("mode") or "offline", r["batch_size"], r.get("request_rate"), r.get("load"))


def _labels(df: pd.DataFrame) -> tuple[list[str], str]:
    """Each row's cell name from the parts that differ between rows, and the parts all rows share (said
    once, in the title): `llamacpp/q8_0` rather than `llamacpp/tiny/q8_0/default b1` on every line."""
    records = df.to_dict("records")
    parts = []
    for r in records:
        wl = r.get("workload")
        env = r.get("env")
        parts.append({"framework": str(r["framework"]), "model": str(r["model"]), "quantization": str(r["quantization"]),
                      "flags": str(r["flags"]), "env": f"env {env}" if isinstance(env, str) else "",
                      "workload": wl if isinstance(wl, str) else "",
                      "load": _load(r)})
    varying = [p for p in _PARTS if len({x[p] for x in parts}) > 1]
    shared = [parts[0][p] if p in ("load", "env") else f"{p} {parts[0][p]}" for p in _PARTS
              if p not in varying and parts and parts[0][p]]
    names = ["/".join(x[p] for p in varying if p not in ("workload", "load") and x[p])
             + "".join(f" [{x['workload']}]" for p in varying if p == "workload" and x["workload"])
             + "".join(f" {x['load']}" for p in varying if p == "load") for x in parts]
    return [escape(n.strip() or "-") for n in names], ", ".join(shared)


def _table(title: str, caption: str | None = None) -> Table:
    return Table(title=title, caption=caption, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                 padding=(0, 1, 0, 0), caption_justify="left")


def _col(t: Table, name: str, right: bool = False, fold: bool = False, min_width: int | None = None) -> None:
    """A column of one line per row: the last, folding one (a reason) ends in '...' where it is too long."""
    t.add_column(name, justify="right" if right else "left", no_wrap=True, min_width=min_width,
                 overflow="ellipsis" if fold else "crop")


def _fit(t: Table) -> Table:
    """The folding column (the last) gets what the others leave of the terminal's width, so that every row
    stays one line: the others keep their whole values, the last ends in '...'."""
    from rich.measure import Measurement

    from orchestrator.report.console import out

    last = t.columns[-1]
    last.max_width = 1
    rest = Measurement.get(out, out.options, t).maximum - 1
    last.max_width = max(last.min_width or 1, out.width - rest)
    return t


# the long call words, shortened where a line must fit (the README says what each means)
_CALL = {"no difference": "no diff.", "not distinguishable": "can't tell"}


def _short(text: str) -> str:
    """Numbers as few characters say them: 1.0e-03 -> 1e-3, 1.7e-03 -> 1.7e-3."""
    return re.sub(r"e([-+])0*(\d)", r"e\1\2", re.sub(r"(\d)\.0e", r"\1e", text))


def decided_by(r: dict) -> str:
    """The figures that decide a cell's logit/text verdict, in a few words: the first bound it crossed
    (`kl_mean 0.015 > kl_near 0.01`), its closeness where lossless, why where not judged."""
    v, why = r.get("verdict"), str(r.get("verdict_reason") or "")
    if v == "identical":
        return "bitwise identical"
    if v == "lossless":
        noise = " (within noise)" if "noise floor" in why else ""
        return f"KL {_g(r.get('kl_mean'))}, max_abs {_g(r.get('max_abs'))}{noise}"
    clauses = why.split("; ")
    return _short(clauses[0]) + (f" (+{len(clauses) - 1})" if len(clauses) > 1 and v != "n/a" else "")


def _bound(v) -> str:
    """An interval's bound: 0.78, 18.5, 680, 20800 (never 2.08e+04)."""
    if not finite(v):
        return ""
    return format(v, ".2f") if abs(v) < 10 else format(v, ".3g") if abs(v) < 1000 else format(v, ".0f")


def speed_text(r: dict, call: bool = True, reason: bool = True) -> str:
    """The cell/baseline speed ratio, its 95% interval and (call=True) its q over the run's speed tests,
    `paired` where the interval is the paired t (data.speed_q_text), the call: `13.76x [10.2, 18.4] q=0.003 faster`.
    The one way every table, terminal or report, writes a speed-up; reason=False leaves a withheld call's why to
    another column (speed_why)."""
    if not finite(r.get("speedup")):
        return ""
    ci = f" [{_bound(r.get('speedup_lo'))}, {_bound(r.get('speedup_hi'))}]" if finite(r.get("speedup_lo")) else ""
    word = _CALL.get(r.get("speed_call"), r.get("speed_call")) if call and isinstance(r.get("speed_call"), str) else ""
    if reason and speed_why(r):
        word += f" ({speed_why(r)})"
    return f"{r['speedup']:.2f}x{ci} {speed_q_text(r) if word else ''}{word}".rstrip()


def speed_why(r: dict) -> str:
    """Why a speed call was withheld (`host busy during 4 of 6 repeats`), or ""."""
    withheld = r.get("speed_call") == "cannot judge" and isinstance(r.get("speed_reason"), str)
    return r["speed_reason"] if withheld else ""


def _styled(word, styles: dict) -> str:
    return f"[{styles.get(word, '')}]{word}[/]" if isinstance(word, str) and word in styles else ""


def compare_compact(df: pd.DataFrame) -> Table:
    """`bench compare`: one line per cell: the cell, its logit/text verdict and what decided it, the task
    verdict where the run has tasks, and the speed-up with its interval and call. The sampling verdicts
    have a table of their own below it, one line per cell (sampling_compact): a fifth verdict column
    would leave no room for the figures at 120 columns."""
    names, shared = _labels(df)
    layers = [("tasks", "task_verdict")] if "task_verdict" in df and df["task_verdict"].notna().any() else []
    t = _table("Lossless comparison" + (f" ({shared})" if shared else ""),
               "--wide: every column; --format csv|json|md: for scripts")
    _col(t, "cell")
    _col(t, "verdict")
    for name, _ in layers:
        _col(t, name)
    _col(t, "speed-up [95% CI]", right=True)
    _col(t, "decided by", fold=True, min_width=16)
    for name, r in zip(names, df.to_dict("records")):
        t.add_row(name, _styled(r["verdict"], _VERDICT), *[_styled(r.get(col), _LAYER) for _, col in layers],
                  speed_text(r, reason=False),
                  escape("; ".join(x for x in (decided_by(r), speed_why(r) and f"speed: {speed_why(r)}") if x)))
    return _fit(t)


def summary_compact(df: pd.DataFrame, title: str) -> Table:
    """`bench show` and `bench run`: one line per cell: status, TTFT, TPOT, throughput, peak memory, how many
    timed repeats the rest of the host disturbed (host busy) and,
    for a cell that did not run, the first words of why."""
    from orchestrator.report.console import host_busy_label

    def num(v, spec: str) -> str:
        return format(v, spec) if finite(v) else "-"

    serve = "mode" in df and (df["mode"] == "serve").any()
    df = df.sort_values(["framework", "model", "quantization", "flags", "mode", "batch_size", "request_rate"],
                        na_position="first")
    names, shared = _labels(df)
    t = _table(title + (f" ({shared})" if shared else ""), "--wide: every column; --format csv|json|md: for scripts")
    for col in ("cell", "status", "TTFT p50 ms", "TPOT p50 ms", "out tok/s", "peak MiB", "host busy",
                *(["errors"] if serve else [])):
        _col(t, col, right=col not in ("cell", "status"))
    _col(t, "reason", fold=True, min_width=12)
    for name, r in zip(names, df.to_dict("records")):
        color = "green" if r["status"] == "ok" else ("yellow" if r["status"] == "unsupported" else "red")
        reason = r["reason"].strip().splitlines() if isinstance(r.get("reason"), str) else []
        t.add_row(name, f"[{color}]{r['status']}[/]", num(r.get("ttft_ms_p50"), ".2f"), num(r.get("tpot_ms_p50"), ".2f"),
                  num(r.get("output_tok_s"), ".1f"), num((r.get("peak_mem_bytes") or float("nan")) / 2**20, ".0f"),
                  host_busy_label(r), *([num(r.get("errors"), ".0f")] if serve else []),
                  escape(reason[0]) if reason else "")
    return _fit(t)


def task_compact(tv: pd.DataFrame) -> Table:
    """The task layer, one line per cell and task: the score, the paired change with its interval, p. The cells whose
    every task says `no change` share one line at the end (`--wide`: a line each)."""
    names, shared = _labels(tv)
    quiet = tv.groupby("cell_id").task_verdict.transform(lambda v: (v == "no change").all()) if len(tv) else tv.cell_id
    t = _table("Task layer" + (f" ({shared})" if shared else ""),
               "--wide: a line for every cell and task" if len(tv) and quiet.any() else None)
    for col in ("cell", "task", "n", "score", "change [95% CI]", "p", "q", "verdict"):
        _col(t, col, right=col in ("n", "score", "change [95% CI]", "p", "q"))
    for name, r, same in zip(names, tv.to_dict("records"), quiet if len(tv) else []):
        if same:
            continue
        judged = r["task_verdict"] != "n/a"
        change = f"{_g(r.get('change'), '+.3f')} [{_g(r.get('change_lo'), '+.3f')}, {_g(r.get('change_hi'), '+.3f')}]" \
            if judged and finite(r.get("change")) else ""
        t.add_row(name, str(r["task"]), f"{int(r['n'])}" if finite(r.get("n")) else "", _g(r.get("score"), ".3f"),
                  change, _g(r.get("p_value"), ".3g") if judged else "", q_text(r),
                  _styled(r["task_verdict"], _LAYER) + ("" if judged else f" {escape(str(r.get('task_reason') or ''))}"))
    if len(tv) and quiet.any():
        cells, tasks = tv[quiet].cell_id.nunique(), tv[quiet].task.nunique()
        t.add_row(f"{cells} other cell{'s' * (cells != 1)}" if not quiet.all() else f"all {cells} cells",
                  f"{tasks} task{'s' * (tasks != 1)}", f"{int(tv[quiet].n.min())}+" if finite(tv[quiet].n.min()) else "",
                  "", "", "", "", _styled("no change", _LAYER) + " (every task)")
    return t


def sampling_compact(sv: pd.DataFrame) -> Table:
    """The sampling layer, one line per cell: the shift in nats/token, p, the verdict and why."""
    names, shared = _labels(sv)
    t = _table("Sampling layer" + (f" ({shared})" if shared else ""))
    for col in ("cell", "samples", "shift nats/tok", "p", "verdict"):
        _col(t, col, right=col in ("samples", "shift nats/tok", "p"))
    _col(t, "why", fold=True, min_width=12)
    for name, r in zip(names, sv.to_dict("records")):
        v = r.get("sampling_verdict") or "n/a"
        why = (str(r.get("sampler_note") or "") if v == "sampler differs" else
               f"could see {r['dist_detectable']:.3g} nats/tok" if v == "not distinguishable" and
               finite(r.get("dist_detectable")) else "" if v != "n/a" else str(r.get("sampling_reason") or ""))
        t.add_row(name, str(r.get("samples_n", "")), _g(r.get("dist_shift"), "+.4f"), _g(r.get("dist_p"), ".3g"),
                  _styled(v, _LAYER), escape(why))
    return _fit(t)


# ----------------------------------------------------------------------------------------- for scripts

def _plain(cell) -> str:
    text = cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain
    return " ".join(text.split())


def markdown(table: Table) -> str:
    """A rich table as a Markdown pipe table: the same header and cells, markup dropped."""
    cols = [[_plain(c.header)] + [_plain(x) for x in c.cells] for c in table.columns]
    rows = list(zip(*cols))
    line = lambda cells: "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"
    align = ["---:" if c.justify == "right" else "---" for c in table.columns]
    head = [f"### {_plain(table.title)}", ""] if table.title else []
    return "\n".join(head + [line(rows[0]), "| " + " | ".join(align) + " |", *map(line, rows[1:])]) + "\n"


def records(df: pd.DataFrame) -> list[dict]:
    """Every column of a frame as JSON-ready records (NaN: null; JSON text columns stay text)."""
    return json.loads(df.to_json(orient="records", date_format="iso", default_handler=str))


def render(fmt: str, frames: dict[str, pd.DataFrame], tables: list[Table]) -> str:
    """`--format`: csv is the first frame (the cells) with every column; json every frame by name, every
    column; md the tables as printed."""
    if fmt == "csv":
        buf = io.StringIO()
        next(iter(frames.values())).map(csv_safe).to_csv(buf, index=False)
        return buf.getvalue()
    if fmt == "json":
        return json.dumps({name: records(df) for name, df in frames.items()}, indent=1) + "\n"
    return md_page_inert("\n".join(markdown(t) for t in tables))


def against_compact(df: pd.DataFrame, new: str, old: str) -> Table:
    """`bench compare NEW --against OLD`: one line per pair: the verdict, the tasks, the throughput ratio
    NEW/OLD with its interval and call, the TTFT p99 and TPOT p50 ratios with their calls."""
    def ratio(r: dict, name: str, ci: bool) -> str:
        v, lo, hi, call = (r.get(f"{name}_{x}") for x in ("ratio", "lo", "hi", "call"))
        if not finite(v):
            return ""
        interval = f" [{_bound(lo)}, {_bound(hi)}]" if ci and finite(lo) and finite(hi) else ""
        return f"x{v:.2f}{interval} {_CALL.get(call, call) if isinstance(call, str) else ''}".rstrip()

    names, shared = _labels(df)
    tasks = "task_verdict" in df and df["task_verdict"].notna().any()
    t = _table(f"{escape(new)} against {escape(old)}" + (f" ({shared})" if shared else ""),
               "--wide: every column; --format csv|json|md: for scripts")
    for col in ("cell", "verdict", *(["tasks"] if tasks else []), "out tok/s [95% CI]", "TTFT p99", "TPOT p50"):
        _col(t, col, right=col not in ("cell", "verdict", "tasks"))
    _col(t, "decided by", fold=True, min_width=12)
    for name, r in zip(names, df.to_dict("records")):
        t.add_row(name, _styled(r["verdict"], _VERDICT), *([_styled(r.get("task_verdict"), _LAYER)] if tasks else []),
                  ratio(r, "tok_s", True), ratio(r, "ttft_p99", False), ratio(r, "tpot_p50", False),
                  escape(decided_by(r)))
    return _fit(t)


def emit(fmt: str, frames: dict, tables: list, lines: list[str] = (), notes: list[str] = ()) -> None:
    """The tables on the terminal (with `lines` after the first, unwrapped, and `notes`, wrapped to the
    terminal), or every frame / table in a format (md: the notes as a list after the tables)."""
    from orchestrator.report.console import out, print_table

    if fmt == "table":
        for i, table in enumerate(tables):
            print_table(table)
            if i == 0:
                for line in lines:
                    out.print(line, highlight=False, markup=False, soft_wrap=True)
                for line in notes:
                    out.print(line, highlight=False, markup=False)
        return
    sys.stdout.write(render(fmt, {k: v for k, v in frames.items() if v is not None and len(v)}, tables))
    if fmt == "md" and notes:
        sys.stdout.write(md_page_inert("\n" + "\n".join(f"- {x.strip()}" if i else f"**{x.rstrip(':')}**\n"
                                                        for i, x in enumerate(notes)) + "\n"))
