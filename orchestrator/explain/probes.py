"""Probes: the explained cell's configuration with some suspects moved to the baseline's side, each a cell of a
probe matrix run by the normal runner into RUN/explain/<cell_id>/probes/ beside the baseline's cells, and
judged there against them as `bench compare` judges (orchestrator/judge/analysis.py).

The probe matrix is the run's own matrix cut down: the cell's model, lengths and workload; the baseline's
configuration at the batch sizes the run had (its noise floor: run to run, batch 1 vs the largest batch); one
flag set per set of moved flags, named by them (`xp-kv_cache_types+flash_attn`, `xp-as-is`), and one `include`
entry per probe. Only the logit and text layers are needed, so one timed batch, no warm-up, no seeded samples
and no tasks; the scoring (prompts, length, greedy tokens, score repeats) stays the run's. Each round rewrites
probes.yaml with every probe so far and runs it into the same run dir: stored cells are skipped (the same
configuration has the same cell id), so a probe is never run twice, also across `bench explain` calls.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from rich.console import Console

from adapters import ADAPTERS
from adapters.base import normalize_quantization
from orchestrator.explain.suspects import moved_options
from orchestrator.matrix.cells import expand
from orchestrator.matrix.models import Matrix
from orchestrator.matrix.validate import parse_matrix
from orchestrator.store.explain_file import EXPLAIN_DIR, Probe, Suspect
from orchestrator.values import finite

PROBES_DIR = "probes"            # RUN/explain/<cell_id>/probes/: the probes' run dir
PROBE_MATRIX = "probes.yaml"     # RUN/explain/<cell_id>/probes.yaml: the matrix it was run from
GOAL = ("identical", "lossless")  # a probe restores the cell when it reaches one of these


def _int(v: Any) -> int | None:
    return int(v) if finite(v) else None


class ProbeRunner:
    """Runs probes of one cell, each set of moved suspects once (the cache), and judges them."""

    def __init__(self, run_dir: Path, matrix: Matrix, cell: dict[str, Any], baseline_rows: pd.DataFrame,
                 suspects: list[Suspect], address: str | None = None, console: Console | None = None,
                 quiet: bool = False):
        self.folder = Path(run_dir) / EXPLAIN_DIR / cell["cell_id"]
        self.matrix, self.cell, self.baseline_rows = matrix, cell, baseline_rows
        self.suspects = {s.name: s for s in suspects}
        self.order = [s.name for s in suspects]            # declaration order: names read the same every time
        self.address, self.console, self.quiet = address, console or Console(stderr=True), quiet
        self.cache: dict[frozenset[str], Probe] = {}
        self.probes: list[Probe] = []                      # in the order run
        self.rounds = 0
        self.options = matrix.engine_options(cell["framework"], cell["flags"])

    @property
    def run_dir(self) -> Path:
        return self.folder / PROBES_DIR

    def _config(self, moved: frozenset[str]) -> tuple[str, str, int, dict[str, Any], str | None]:
        """(flag-set name, quantization, batch size, options, env) of a probe."""
        chosen = [self.suspects[n] for n in self.order if n in moved]
        flags = [s.name for s in chosen if s.kind == "flag"]
        quant, batch, env = self.cell["quantization"], int(self.cell["batch_size"]), self.cell.get("env")
        for s in chosen:
            if s.kind == "quantization":
                quant = s.moved_value["quantization"]
            elif s.kind == "batch_size":
                batch = int(s.moved_value["batch_size"])
            elif s.kind == "environment":
                env = s.moved_value["env"]
        options = moved_options(ADAPTERS[self.cell["framework"]], self.options, chosen)
        return "xp-" + ("+".join(flags) if flags else "as-is"), normalize_quantization(quant), batch, options, env

    def matrix_data(self, sets: list[frozenset[str]]) -> dict[str, Any]:
        """The probe matrix (as YAML data) holding the baseline's cells and a probe per set."""
        c, m = self.cell, self.matrix
        base = self.baseline_rows.iloc[0]
        data = m.model_dump(mode="json", exclude_unset=True)
        fw, bfw, bflags = c["framework"], str(base["framework"]), str(base["flags"])
        flags: dict[str, dict[str, Any]] = {}
        if bflags != "default":
            flags.setdefault(bfw, {})[bflags] = m.flag_sets(bfw)[bflags]
        include = []
        for moved in sets:
            name, quant, batch, options, env = self._config(moved)
            flags.setdefault(fw, {})[name] = options
            rule = {"framework": fw, "model": c["model"], "quantization": quant, "batch_size": batch, "flags": name,
                    "input_len": int(c["input_len"]), "output_len": int(c["output_len"]), "mode": c["mode"]}
            if c.get("workload"):
                rule["workload"] = c["workload"]
            if env is not None:
                rule["env"] = env
            include.append(rule)
        # the baseline's own axes (a selector may fix its model or batch; it may have fallen back to other lengths)
        axes: dict[str, Any] = {
            "framework": [bfw], "model": [str(base["model"])], "quantization": [str(base["quantization"])],
            "batch_size": sorted({int(b) for b in self.baseline_rows.batch_size}), "flags": [bflags],
            "input_len": [int(base["input_len"])], "output_len": [int(base["output_len"])],
            "mode": [str(base["mode"])]}
        if isinstance(base.get("workload"), str):
            axes["workload"] = [base["workload"]]
        if isinstance(base.get("env"), str):   # an env axis: the baseline's env (probes name theirs)
            axes["env"] = [base["env"]]
        measure = {k: v for k, v in data.get("measure", {}).items() if k != "sampling"}
        models = {name: data["models"][name] for name in dict.fromkeys([c["model"], str(base["model"])])}
        data |= {"name": f"explain-{c['cell_id']}", "models": models,
                 "axes": axes, "flags": flags, "include": include, "exclude": [], "tasks": [],
                 # the logit and text layers only: one timed batch, no warm-up, samples or tasks
                 "measure": measure | {"warmup": 0, "repeats": 1, "paired_timing": False}}
        return data

    def run(self, sets: list[tuple[frozenset[str], str]]) -> list[Probe]:
        """Probe each (moved set, phase) not probed yet, all in one round; returns the probes of every set asked."""
        new = [(s, phase) for s, phase in dict(sets).items() if s not in self.cache]
        if new:
            self._round(new)
        return [self.cache[s] for s, _ in sets]

    def _round(self, new: list[tuple[frozenset[str], str]]) -> None:
        from orchestrator.execution.runner import run_matrix
        from orchestrator.judge.verdicts import judge_run

        self.rounds += 1
        all_sets = [*self.cache, *(s for s, _ in new)]
        data = self.matrix_data(all_sets)
        m = parse_matrix(data, PROBE_MATRIX)                       # the same checks as any matrix, before Ray
        path = self.folder / PROBE_MATRIX
        from orchestrator.store.run_store import atomic_write_text

        atomic_write_text(path, "# written by `bench explain`: the probes of one cell (orchestrator/explain/probes.py)\n"
                          + yaml.safe_dump(data, sort_keys=False))
        if not self.quiet:
            names = ", ".join("+".join(sorted(s)) or "as is" for s, _ in new)
            self.console.print(f"explain {self.cell['cell_id']}: round {self.rounds}, {len(new)} probe"
                               f"{'' if len(new) == 1 else 's'} ({names})")
        from orchestrator.store.run_store import RunStore

        stored = set(RunStore(self.run_dir).stored_status()) if self.run_dir.exists() else set()
        started = time.monotonic()
        run_matrix(path, self.run_dir, self.address, console=self.console, quiet=True)
        wall = time.monotonic() - started
        # the logit and text layers decide a probe (its tasks and samples are not run)
        judged = judge_run(self.run_dir, tasks=False, sampling=False).cells.drop_duplicates("cell_id").set_index("cell_id")
        ids = {(c.framework, c.flags, c.quantization, c.batch_size, c.env): c.cell_id for c in expand(m)}
        for moved, phase in new:
            name, quant, batch, _, env = self._config(moved)
            cid = ids.get((self.cell["framework"], name, quant, batch, env))
            probe = Probe(index=len(self.probes), round=self.rounds, phase=phase,
                          moved=[n for n in self.order if n in moved], cell_id=cid, flags=name,
                          quantization=quant, batch_size=batch, round_wall_s=round(wall, 1), reused=cid in stored)
            row = judged.loc[cid] if cid in judged.index else None
            if row is None:   # the runner stores every cell it was given, crashed or not: say so, never guess
                probe.status, probe.reason = "missing", "the probe run stored no row for this cell"
            else:
                probe.status = str(row["status"])
                probe.reason = row.get("reason") if isinstance(row.get("reason"), str) else None
                verdict = row.get("verdict")
                probe.verdict = verdict if isinstance(verdict, str) else None
                vr = row.get("verdict_reason")
                probe.verdict_reason = vr if isinstance(vr, str) else None
                for k in ("max_abs", "kl_mean", "top1"):
                    setattr(probe, k, float(row[k]) if finite(row.get(k)) else None)
                probe.restores = probe.status == "ok" and probe.verdict in GOAL
            self.cache[moved] = probe
            self.probes.append(probe)
