"""Verdicts from stored runs alone (no engine runs here): the logit and text layers against a
baseline and its noise floor (analysis.py, logits.py, speed.py; which cell is whose baseline:
orchestrator/matrix/baselines.py), the task layer
(task_verdicts.py, task_stats.py), the sampling layer (sampling_verdicts.py, sampling_stats.py), a
run against a stored one (cross_run.py), the gate's policy (gate.py), SLO searches read back
(searches.py), history over runs (history.py), and where the layers disagree (reconcile.py). `bench plan`
reads verdict-free capacity from a run: orchestrator/capacity. `bench diff-endpoints`, which
talks to live servers, is orchestrator/endpoints.

May import: orchestrator.values, orchestrator.inputs, orchestrator.matrix, orchestrator.store,
adapters (the registry), adapters.base, adapters.contract. Never orchestrator.execution or report.
"""
