"""The matrix: its pydantic models (models.py), loading and validation with YAML paths
(validate.py; the file's bytes and YAML in yamltext.py, its local paths in paths.py, the quantization recipes it
names in recipes.py), its cells and engine groups (cells.py), what a group asks of a node (placement.py), and which cell is
each cell's baseline (baselines.py: read by the judge, and by the run's rescoring of samples).

May import: orchestrator.values, orchestrator.inputs, adapters (the registry), adapters.base,
adapters.contract.
"""
