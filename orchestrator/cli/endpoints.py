"""`bench diff-endpoints`: two live OpenAI-compatible servers, the same prompts."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from orchestrator.cli.app import app, fail


@app.command("diff-endpoints")
def diff_endpoints_cmd(url_a: str = typer.Argument(..., help="Base URL of endpoint A, e.g. http://127.0.0.1:8000"),
                       url_b: str = typer.Argument(..., help="Base URL of endpoint B"),
                       prompts: Path = typer.Option(..., "--prompts", exists=True, dir_okay=False,
                                                    help="Text lines, or JSONL with a \"prompt\" field"),
                       repeats: int = typer.Option(2, "--repeats", min=1, help="Times each prompt is sent to each endpoint"),
                       max_tokens: int = typer.Option(32, "--max-tokens", min=1),
                       seed: int = typer.Option(0, "--seed"),
                       temperature: float = typer.Option(0.0, "--temperature", min=0.0,
                                                         help="Above 0: seeded samples (--seeds per prompt) at this "
                                                         "temperature, compared seed by seed and as a distribution"),
                       top_p: float = typer.Option(1.0, "--top-p", min=0.0, max=1.0),
                       top_k: int = typer.Option(0, "--top-k", min=0, help="0: off"),
                       seeds: int = typer.Option(16, "--seeds", min=2, help="With --temperature: seeds per prompt"),
                       seed_offset: int = typer.Option(0, "--seed-offset", min=0,
                                                       help="With --temperature: B's seeds start here (A's at 0); "
                                                       "two identical servers on other seeds measure the tests' "
                                                       "false alarms"),
                       sampler_order: str = typer.Option("", "--sampler-order",
                                                         help="With --temperature: the framework whose sampler B runs "
                                                         "(hf, llamacpp, vllm): the order of its filters, for the "
                                                         "first-token test against A's next-token logprobs"),
                       next_top_k: int = typer.Option(100, "--next-top-k", min=1,
                                                      help="With --temperature: next-token candidates asked of A"),
                       timeout_s: float = typer.Option(120.0, "--timeout", help="Per-request timeout (s)"),
                       as_json: bool = typer.Option(False, "--json", help="Print the report as JSON")) -> None:
    """Send each prompt to two /v1/completions endpoints N times at temperature 0 and report differing outputs;
    with --temperature, N seeds per prompt at the given sampler: differing outputs per seed, and whether the
    two samples come from the same distribution."""
    from orchestrator.endpoints.diff import (
        diff_endpoints,
        diff_sampled,
        format_diff_report,
        format_sampled_report,
        read_prompts,
    )

    items = read_prompts(prompts)
    if not items:
        fail(f"no prompts in {prompts}")
    from adapters import ADAPTERS

    order = getattr(ADAPTERS.get(sampler_order), "sampler_order", None) if sampler_order else None
    if sampler_order and order is None:
        known = ", ".join(k for k, a in ADAPTERS.items() if a.sampler_order)
        fail(f"--sampler-order: unknown or unchecked framework '{sampler_order}' (known: {known})", code=2)
    try:
        if temperature > 0:
            report = diff_sampled(url_a, url_b, items, seeds=seeds, max_tokens=max_tokens, temperature=temperature,
                                  top_p=top_p, top_k=top_k, timeout_s=timeout_s, sampler_order=order,
                                  next_top_k=next_top_k, first_seed=(0, seed_offset))
        else:
            report = diff_endpoints(url_a, url_b, items, repeats=repeats, max_tokens=max_tokens, seed=seed,
                                    timeout_s=timeout_s)
    except Exception as e:  # connection refused, HTTP errors: one line, exit 1
        fail(f"diff-endpoints: {type(e).__name__}: {e}")
    print(json.dumps(report, indent=2) if as_json else (format_sampled_report(report) if temperature > 0
                                                         else format_diff_report(report)))
