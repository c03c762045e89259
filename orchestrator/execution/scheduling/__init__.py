"""Where and when each engine group runs: how long it will take (estimate.py, model_size.py), which node takes
which group or part of one and when (dispatch.py), work stealing between running parts (ledger.py), and the Ray
tasks that carry them, pinned to their nodes (scheduler.py)."""
