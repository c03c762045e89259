"""The matrix: its pydantic models (models.py), loading and validation with YAML paths
(validate.py), its cells and engine groups (cells.py), and what a group asks of a node (placement.py).

May import: orchestrator.values, orchestrator.inputs, adapters (the registry), adapters.base,
adapters.contract.
"""
