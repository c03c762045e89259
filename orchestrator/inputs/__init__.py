"""What a run is made of, read and checked before anything runs: request lengths, local and Hugging
Face datasets, chat templates, the task sets and their per-item metrics, the built-in tiny model
and the text it is trained and scored on (data/).

May import: orchestrator.values, adapters.contract.
"""
