"""The `bench` command: `app` (app.py, with what every command shares) and one module per group of commands,
each registering its commands on `app` when imported here: running.py (validate, schema, run, submit, status,
model), reading.py (report, ls, show, plan, export, compact, verify, history), judging.py (compare, gate), endpoints.py
(diff-endpoints); `bench explain` and `bench env` have their bodies in orchestrator/explain and
orchestrator/environments.

May import: orchestrator.values, orchestrator.inputs, orchestrator.matrix, orchestrator.store,
orchestrator.execution, orchestrator.judge, orchestrator.report, orchestrator.explain, orchestrator.environments,
orchestrator.endpoints, orchestrator.capacity, adapters (the registry), adapters.base, adapters.contract.
"""

# each module registers its commands on `app` when imported; this order is the order of `bench --help`
from orchestrator.cli import running  # noqa: F401, I001
from orchestrator.cli import reading  # noqa: F401
from orchestrator.cli import endpoints  # noqa: F401
from orchestrator.cli import judging  # noqa: F401
from orchestrator.cli.app import app

__all__ = ["app"]
