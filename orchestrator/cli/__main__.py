"""`python -m orchestrator.cli`: the `bench` command, as the console script runs it."""

from orchestrator.cli import app

app()
