"""`bench run`: matrix -> engine groups -> Ray tasks -> engine children -> stored rows.

runner.py reads top to bottom; preflight.py resolves each model once and rules out, before Ray or any
engine starts, the pairs that cannot run, and asks every node for the model paths only nodes can have;
scheduling/ (scheduler.py, dispatch.py, ledger.py, estimate.py, model_size.py) decides what runs where and
when; engine_child/ (spec.py, prompts.py, supervisor.py, rows.py) is the launcher of one engine group (the spec
written for the child with every request's token ids, the child supervised, its files turned into rows);
progress.py is what the user sees while it runs (fed by the parts' reports to scheduling/ledger.py's progress
board); rescore.py, after the cells, has the baseline's engine score
every cell's seeded samples; reaper.py ends a local cluster with its driver; stop.py makes SIGTERM stop a
run as Ctrl-C does (exit 143); jobs.py is
`bench submit` / `bench status`.

May import: orchestrator.values, orchestrator.inputs, orchestrator.matrix, orchestrator.store,
adapters (the registry), adapters.base, adapters.contract. Never orchestrator.judge or report.
"""
