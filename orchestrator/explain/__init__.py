"""`bench explain`: the culprit search for a cell that is not lossless against its baseline. suspects.py lists
what differs from the baseline's side (each adapter's declared numerics flags, batch size 1, the quantization);
probes.py runs probes, each the cell's configuration with some suspects moved, as cells of a probe matrix through
the normal runner into RUN/explain/<cell_id>/ and judges them there; search.py moves one suspect at a time, then
delta-debugs the set (ddmin); command.py is the command and its terminal output; layers.py is `--layers`' arithmetic
(per-layer relative error of Adapter.hidden_states captures against the baseline's floor), layer_run.py its engine
work (the cell's and the baseline's captures, each in an engine child); sensitivity.py is `--sensitivity` (a
llama.cpp cell's tensor groups quantized one at a time, as probe cells against fp32) and recipe.py `--recipe` (the
smallest per-tensor mix within a KL budget, timed beside llama.cpp's presets). The result is stored for the
report by orchestrator/store/explain_file.py.

May import: orchestrator.values, orchestrator.inputs, orchestrator.matrix, orchestrator.store,
orchestrator.execution, orchestrator.judge, adapters (the registry), adapters.base, adapters.contract.
Never orchestrator.report.
"""
