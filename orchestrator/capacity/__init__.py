"""`bench plan`: capacity from a stored run (plan.py): per engine configuration the cheapest batch size that meets
the SLOs, the replicas and GPUs a request rate needs, and the cost per million tokens. It reads the cells and the
SLO searches (orchestrator/judge/searches.py) a run stored; it judges nothing.

May import: orchestrator.values, orchestrator.matrix, orchestrator.store, orchestrator.judge.
"""
