"""What a person reads: every terminal table (console.py; compact.py, the one-line-per-cell ones; run_summary.py,
what `bench run` ends with), report.html (html.py, figures.py, html_tables.py) and report.md (md.py) from one
loaded run (data.py) with the panels both formats share (panels/), history.html, and the gate's JUnit and Markdown
files.

May import: orchestrator.values, orchestrator.inputs, orchestrator.matrix, orchestrator.store,
orchestrator.judge. Never orchestrator.execution.
"""
