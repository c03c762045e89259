"""The run directory: the tables' schemas (schema.py), the journal a run appends to (journal.py),
its compaction into Parquet (compaction.py, bulk_parquet.py), the rule that picks each cell's newest
copy (layout.py), the store readers and writers go through (run_store.py), the salvage of a damaged
journal (salvage.py), the manifest, the runs of a results root (runs.py), `bench export`, what `bench explain` stores
(explain_file.py; `--layers`' report: layers_file.py) and the samples as the baseline's engine scored them (rescored_file.py).

May import: orchestrator.values, orchestrator.matrix, adapters (the registry: the packages each engine declares,
whose versions the manifest records), adapters.base, adapters.contract.
"""
