"""One engine group on its node: the typed spec its child gets (spec.py), with every prompt as token ids
(prompts.py); the child process started, followed and ended whatever happens to it (supervisor.py); its files
turned into the cells' rows (rows.py); work beside the cells (rescoring, layer captures) in a child
of its own (side_work.py)."""
