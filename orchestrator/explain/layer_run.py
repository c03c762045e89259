"""`bench explain RUN CELL --layers`, the engine work: the cell's configuration and its baseline's, each in an
engine child of its own placed by Ray as a group is (as the baseline's rescoring is, orchestrator/execution/
rescore.py), capture the residual stream after every block on the run's first scoring prompts (a GroupSpec with
`hidden`: adapters/worker/layer_capture.py; each block split at its attention where both engines can), the baseline
twice (its floor); the arithmetic (layers.py) aligns them by layer and position; the report is stored through orchestrator/store/layers_file.py."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from adapters.contract.specs import HIDDEN_NPZ, HiddenSpec
from orchestrator.execution.engine_child.side_work import cell_spec, run_side_work
from orchestrator.execution.engine_child.spec import GroupJob
from orchestrator.explain.layers import blocks_only, floor, layer_report, relative_errors
from orchestrator.matrix.cells import Cell, expand, group
from orchestrator.store.layers_file import write_layers
from orchestrator.store.run_store import RunStore

BASE_REPEATS = 2      # the baseline's captures: the floor is the largest relative error between them
PROMPTS = 8           # at most this many of the run's scoring prompts (a capture is layers x positions x hidden)
RUN_LOG = "run.log"


Captures = tuple[list[list[np.ndarray]], bool]     # per repeat, per prompt; whether its blocks are split


def _capture(job: GroupJob, cell: Cell, repeats: int, n_prompts: int, timeout_s: float
             ) -> tuple[Captures | None, str | None]:
    """In a Ray task: the engine child with a hidden spec; ((captures per repeat, split), None) or (None, why)."""
    spec = cell_spec(job, cell)
    if spec.scoring is None or not spec.scoring.prompts:
        return None, "the cell's group has no scoring prompts"
    hidden = HiddenSpec(prompts=spec.scoring.prompts[:n_prompts], repeats=repeats)

    def read(f) -> tuple[Captures | None, str | None]:
        if "unsupported" in f.files:
            return None, str(f["unsupported"])
        caps = [[f[f"r{r}_p{i}"] for i in range(len(hidden.prompts))] for r in range(repeats)]
        return (caps, bool(f["split"])), None

    return run_side_work(job, spec, {"hidden": hidden}, HIDDEN_NPZ, timeout_s, read)


def capture_both(run_dir: Path, cell_id: str, base_id: str, address: str | None, n_prompts: int = PROMPTS
                 ) -> dict[str, tuple[Captures | None, str | None]]:
    """{"cell": ..., "baseline": ...}: each side's captures per repeat, or why there are none."""
    import ray

    from orchestrator.execution.preflight import resolve_models
    from orchestrator.execution.runner import cache_root, group_job
    from orchestrator.execution.scheduling.scheduler import alive_nodes, cluster_device, init_ray, job_need

    store = RunStore(run_dir)
    m = store.read_manifest().matrix
    if m is None:
        raise ValueError(f"{run_dir}'s stored matrix is not one this version reads: the captures cannot be built")
    cells = {c.cell_id: c for c in expand(m)}
    missing = [c for c in (cell_id, base_id) if c not in cells]
    if missing:
        raise ValueError(f"cell(s) {', '.join(missing)} are not cells of the run's stored matrix")
    for name, (_, why) in resolve_models(m, [cells[cell_id].model, cells[base_id].model], str(cache_root())).items():
        if why:
            raise ValueError(f"model {name} cannot be had: {why}")
    init_ray(address, log_file=store.root / RUN_LOG)
    device = cluster_device() if m.run.device == "auto" else m.run.device
    task = ray.remote(max_retries=0)(_capture)
    nodes = list(alive_nodes().values())
    timeout_s = m.run.load_timeout_s + m.run.cell_timeout_s
    refs = {}
    for side, cid, repeats in (("cell", cell_id, 1), ("baseline", base_id, BASE_REPEATS)):
        job = group_job(m, store, group([cells[cid]])[0], device)
        refs[side] = task.options(**job_need(job, nodes).ray_options()).remote(job, cells[cid], repeats, n_prompts, timeout_s)
    out = {}
    for side, ref in refs.items():
        try:
            out[side] = ray.get(ref)
        except Exception as err:  # noqa: BLE001   # the node or the task died: said, never guessed
            out[side] = (None, f"the capture task failed: {type(err).__name__}: {err}")
    return out


def layers_for(run_dir: Path, cell: dict[str, Any], base_config: str, address: str | None,
               n_prompts: int = PROMPTS) -> dict[str, Any]:
    """The cell's layer report against its baseline, stored (layers.json, layers.parquet) and returned; where a
    side could not be captured, the report says why and holds no figures."""
    started = time.monotonic()
    got = capture_both(Path(run_dir), cell["cell_id"], cell["baseline_cell_id"], address, n_prompts)
    report: dict[str, Any] = {"cell_id": cell["cell_id"], "baseline_cell_id": cell["baseline_cell_id"],
                              "baseline_config": base_config, "baseline_repeats": BASE_REPEATS,
                              "floor_from": f"the baseline captured {BASE_REPEATS} times in one engine load "
                                            "(one prompt per forward pass: its batch sizes do not enter)"}
    (cell_got, cell_why), (base_got, base_why) = got["cell"], got["baseline"]
    why = (f"the cell: {cell_why}" if cell_why else None) or (f"the baseline: {base_why}" if base_why else None)
    split = False
    if why is None:   # both split where both could; else whole blocks on both sides
        split = cell_got[1] and base_got[1]
        cell_caps = [c if split or not cell_got[1] else blocks_only(c) for c in cell_got[0]]
        base_caps = [c if split or not base_got[1] else blocks_only(c) for c in base_got[0]]
    if why is None and [a.shape for a in cell_caps[0]] != [a.shape for a in base_caps[0]]:
        why = (f"the captures do not align by layer and position (cell {cell_caps[0][0].shape}, baseline "
               f"{base_caps[0][0].shape} for the first prompt: another architecture or tokenizer)")
    if why is not None:
        report |= {"first_beyond": None, "grows_most": None, "layers": [], "reason": why,
                   "line": f"no layer report: {why.splitlines()[0][:300]}"}
    else:
        report |= layer_report(relative_errors(cell_caps[0], base_caps[0]), floor(base_caps), split=split)
        report |= {"prompts": len(cell_caps[0]), "positions": int(sum(a.shape[1] for a in cell_caps[0])),
                   "blocks": int((cell_caps[0][0].shape[0] - 1) // (2 if split else 1)), "reason": None}
    report["wall_s"] = round(time.monotonic() - started, 1)
    path = write_layers(run_dir, cell["cell_id"], report)
    return report | {"path": str(path)}
