"""`bench run`: matrix -> engine groups -> Ray tasks -> engine children -> stored rows.

runner.py reads top to bottom; preflight.py resolves each model once and rules out, before Ray or any
engine starts, the pairs that cannot run, and asks every node for the model paths only nodes can have;
scheduler.py, dispatch.py, ledger.py, estimate.py and model_size.py decide what runs where and when;
spec.py, supervisor.py and rows.py are the launcher of one engine group (the spec written for the child,
the child supervised, its files turned into rows); prompts.py makes every request's token ids; progress.py is what the user sees while it runs (fed by the parts'
reports to ledger.py's progress board); rescore.py, after the cells, has the baseline's engine score
every cell's seeded samples; reaper.py ends a local cluster with its driver; jobs.py is
`bench submit` / `bench status`.

May import: orchestrator.values, orchestrator.inputs, orchestrator.matrix, orchestrator.store,
adapters (the registry), adapters.base, adapters.contract. Never orchestrator.judge or report.
"""
