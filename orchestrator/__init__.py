"""The driver: everything of `bench` that runs outside the engine processes.

Its subpackages, lowest first; each may import only those listed in its own docstring, and nothing
above it (tests/unit/test_layout.py checks every import by AST):

  values.py    what a stored value is (a measured number, a text cell)
  inputs/      what a run is made of: lengths, datasets, chat templates, task sets, the tiny model
  matrix/      the matrix: its models, validation, cells and engine groups, placement
  store/       the run directory: schemas, journal, compaction, manifest, reading it back, export
  execution/   `bench run`: the scheduler, the launcher of engine children, the prompts they get
  judge/       verdicts from stored runs: logits, text, tasks, sampling, speed, across runs, gate
  report/      what a person reads: the terminal tables, report.html and report.md, the gate's files
  capacity/    `bench plan`: batch, replicas and cost from a stored run (may import judge)
  endpoints/   `bench diff-endpoints`: two live servers (may import judge)
  environments/  engine environments of the env axis: `bench env` creates one (may import values)
  cli/         the `bench` command, one module per group of commands (may import all of the above)

From adapters/ it imports the registry (`adapters`), `adapters.base` and `adapters.contract` only.
"""
