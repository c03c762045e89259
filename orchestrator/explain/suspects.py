"""The suspects of a cell: what a probe may move to the baseline's side.

An adapter's NumericsFlag names option fields and their reference values. Against a baseline of another
engine a probe moves them to the reference (the exact side: an f32 KV cache, eager, no speculation); against
a baseline of the same engine, to the baseline's own values. Only groups whose effective values differ (the
Options model's, so an unset field counts as its default) are suspects. Batch size 1 and the baseline's
quantization are suspects of every engine.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from adapters import ADAPTERS
from adapters.base import Adapter, NumericsFlag, normalize_quantization
from orchestrator.store.explain_file import Suspect


def _effective(adapter: type[Adapter], options: dict[str, Any], fields) -> dict[str, Any]:
    opts = adapter.Options(**options)
    return {f: _plain(getattr(opts, f)) for f in fields}


def _plain(v: Any) -> Any:
    return v.model_dump(mode="json") if hasattr(v, "model_dump") else v


def _target(flag: NumericsFlag, same_engine: bool, baseline_options: dict[str, Any]) -> dict[str, Any]:
    """field -> the value a probe sets (None where the field is to be left unset: the engine's default)."""
    if same_engine:
        return {f: baseline_options.get(f) for f in flag.reference}
    return dict(flag.reference)


def moved_options(adapter: type[Adapter], options: dict[str, Any], suspects: list[Suspect]) -> dict[str, Any]:
    """The cell's options with each flag suspect's fields set to their moved values (None: left unset)."""
    out = dict(options)
    for s in suspects:
        if s.kind != "flag":
            continue
        for f, v in s.moved_value.items():
            default = adapter.Options.model_fields[f].default
            if v is None or v == default:
                out.pop(f, None)     # the default, unset: the flag set stays as short as a person writes it
            else:
                out[f] = v
    return out


def find_suspects(framework: str, options: dict[str, Any], quantization: str, batch_size: int,
                  baseline: dict[str, Any], env: str | None = None) -> tuple[list[Suspect], dict[str, str]]:
    """(the suspects, {name: why it is not one} for declared ones that cannot be moved). `baseline` holds the
    baseline cell's framework, options, quantization and env (the env axis: None without one).

    A cell in another engine environment than its baseline's (an env pair, or any two envs) has the
    environment as a suspect too, first: so the result tells "the environment" (its packages, interpreter and
    variables) apart from the flags, and a set of both where only both together restore."""
    adapter = ADAPTERS[framework]
    same_engine = baseline["framework"] == framework
    suspects: list[Suspect] = []
    skipped: dict[str, str] = {}
    base_env = baseline.get("env")
    if env is not None and base_env is not None and env != base_env:
        suspects.append(Suspect(name=f"env={base_env}", kind="environment", cell_value={"env": env},
                                moved_value={"env": base_env},
                                why="the engine environment: its packages, interpreter and variables"))
    for flag in adapter.numerics_flags:
        target = _target(flag, same_engine, baseline.get("options") or {})
        have = _effective(adapter, options, flag.reference)
        suspect = Suspect(name=flag.name, kind="flag", cell_value=have, moved_value=target, why=flag.why)
        try:
            want = _effective(adapter, moved_options(adapter, options, [suspect]), flag.reference)
        except ValidationError as e:   # e.g. LMDeploy's eager_mode on TurboMind: no such configuration
            skipped[flag.name] = "moving it makes no valid configuration: " + "; ".join(
                str(x.get("msg")) for x in e.errors())
            continue
        if want != have:
            suspects.append(suspect)
    if batch_size != 1:
        suspects.append(Suspect(name="batch_size=1", kind="batch_size", cell_value={"batch_size": batch_size},
                                moved_value={"batch_size": 1}, why="the batch size (batched kernels, padding)"))
    base_quant = normalize_quantization(str(baseline["quantization"]))
    if normalize_quantization(quantization) != base_quant:
        name = f"quantization={base_quant}"
        if base_quant in adapter.quantizations:
            suspects.append(Suspect(name=name, kind="quantization", cell_value={"quantization": quantization},
                                    moved_value={"quantization": base_quant}, why="the weights' quantization"))
        else:
            skipped[name] = f"{framework} does not run {base_quant}"
    return suspects, skipped
