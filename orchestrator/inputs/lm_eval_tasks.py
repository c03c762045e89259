"""`kind: lm_eval` tasks checked with lm-eval's own task index before any engine starts: the task must be
one lm-eval finds (in `include_path`, else among its own), `metric` one of the task's per-item metrics, and
that metric one lm-eval aggregates in a way bench can judge item by item (JUDGED_AGGREGATIONS: not, say,
f1 over the whole set's (gold, prediction) pairs).

The index of `include_path` alone takes about a second; a task not found there is looked up among
lm-eval's ~15k built-in task YAMLs too (about 17 s here), as the engine process would.
"""

from __future__ import annotations

import functools

from adapters.contract.specs import JUDGED_AGGREGATIONS

SHOWN = 20   # names listed in an error, at most


@functools.lru_cache(maxsize=8)
def _index(include_path: str | None, defaults: bool):
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=include_path, include_defaults=defaults)


def _names(names) -> str:
    names = sorted(names)
    return ", ".join(names[:SHOWN]) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def task_metrics(entry) -> dict[str, str | None] | None:
    """The per-item metrics lm-eval's config gives the task (its metric_list, else the defaults of its
    output_type), each with the name of its aggregation (the config's, else lm-eval's default for the
    metric; None: a function the config names); None where the config does not say (a Python task class)."""
    from lm_eval.api.registry import DEFAULT_METRIC_REGISTRY, get_aggregation, get_metric_aggregation
    from lm_eval.tasks._yaml_loader import load_yaml

    if entry.yaml_path is None:
        return None
    cfg = load_yaml(entry.yaml_path, resolve_func=False)   # lm-eval's loader: includes merged, no code run
    if "class" in cfg:
        return None
    listed = [m for m in cfg.get("metric_list") or [] if isinstance(m, dict) and isinstance(m.get("metric"), str)]
    if not listed:
        listed = [{"metric": m} for m in DEFAULT_METRIC_REGISTRY.get(cfg.get("output_type"), [])]
    out = {}
    for m in listed:
        agg = m.get("aggregation")
        if agg is None and (fn := get_metric_aggregation(m["metric"])) is not None:   # the registry's name for it
            agg = next((n for n in JUDGED_AGGREGATIONS if get_aggregation(n) is fn), fn.__name__)
        out[m["metric"]] = agg if isinstance(agg, str) else None
    return out


def problems(task: str, metric: str | None, include_path: str | None, where: str) -> list[str]:
    """What lm-eval would refuse about one entry, as `tasks[i].key: message` lines."""
    try:
        local = _index(include_path, False) if include_path else None
    except ImportError:
        return [f"{where}.task: lm-eval is not installed here (pip install 'lossless-bench[lm_eval]')"]
    index = local if local is not None and task in local.all_tasks else _index(include_path, True)
    if task not in index.all_tasks:
        known = local.all_tasks if local is not None else []
        there = f" in {include_path} (it has: {_names(known) or 'none'})" if include_path else ""
        return [f"{where}.task: lm-eval has no task {task!r}{there}"]
    entry = index.task_index[task]
    if entry.kind.name != "TASK":
        return [f"{where}.task: {task!r} is an lm-eval {entry.kind.name.lower()}; list its tasks one by one"]
    metrics = task_metrics(entry)
    if not metrics:
        return []
    if metric is not None and metric not in metrics:
        return [f"{where}.metric: lm-eval task {task} has no metric {metric!r} (it has: {_names(metrics)})"]
    chosen = metric or next(iter(metrics))
    agg = metrics[chosen]
    if agg is not None and agg not in JUDGED_AGGREGATIONS:
        judged = [m for m, a in metrics.items() if a in JUDGED_AGGREGATIONS]
        return [f"{where}.metric: lm-eval aggregates {chosen} of {task} with {agg} over the whole set, which has no "
                f"per-item score to judge (metrics aggregated by {', '.join(JUDGED_AGGREGATIONS)} can be: "
                f"{_names(judged) or 'none of this task'})"]
    return []


def model_max_length(model_source: str, tokenizer_source: str) -> int:
    """The max_length lm-eval's HF backend gives a model (its rolling window and truncation length): lm-eval's
    own `resolve_max_length` on the model's local config (n_positions, max_position_embeddings, n_ctx), then
    the tokenizer's model_max_length, then lm-eval's default of 2048."""
    import json
    from pathlib import Path
    from types import SimpleNamespace

    from lm_eval.models.utils import DEFAULT_MAX_LENGTH, resolve_max_length

    def _read(source: str, name: str) -> dict:
        path = Path(source)
        path = path.parent if path.is_file() else path
        try:
            return json.loads((path / name).read_text())
        except (OSError, ValueError):
            return {}

    config = _read(model_source, "config.json")
    text = config.get("text_config")
    if isinstance(text, dict):
        config["text_config"] = SimpleNamespace(**text)
    as_config = SimpleNamespace(**config)
    tokenizer = SimpleNamespace(**{k: v for k, v in _read(tokenizer_source, "tokenizer_config.json").items()
                                   if k == "model_max_length"})
    return resolve_max_length(as_config, tokenizer, default=DEFAULT_MAX_LENGTH)
