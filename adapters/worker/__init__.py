"""The engine child: `python -m adapters.worker SPEC.json OUT_DIR` runs one engine group in the
framework's own interpreter (group.py), its cells (cell_loop.py; served cells: served_cells.py) and
their tasks (task_runner.py, task_scoring.py, lm_eval_model.py); or, with no cells, the baseline's engine
scoring other cells' samples (rescoring.py), or an engine capturing its per-layer hidden states (layer_capture.py).

May import: anything in adapters/. Nothing in adapters/ imports it.
"""
