"""Workloads from Hugging Face `datasets` (`kind: hf`): a hub id, a local dataset dir, or one data file,
read with `datasets.load_dataset` into the records that orchestrator/inputs/datasets.py turns into prompts or
conversations. `datasets` is an optional extra (`pip install -e '.[datasets]'`), imported only here.

`bench validate` loads a local dataset and checks its columns; a hub id is fetched only on the node that
runs the cells (validate says so, and checks nothing it cannot see).
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.inputs import datasets

# data files load_dataset reads by its packaged builders
_BUILDERS = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".csv": "csv", ".txt": "text"}


def is_local(name: str) -> bool:
    return Path(name).exists()


def load_records(name: str, config: str | None, split: str) -> list[dict]:
    try:
        import datasets as hf
    except ImportError:
        raise datasets.DatasetError("kind: hf needs the `datasets` package (pip install -e '.[datasets]')") from None
    hf.disable_progress_bars()   # one bar per split in a worker's log says nothing
    load_dataset = hf.load_dataset
    path = Path(name)
    if path.is_file():
        builder = _BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise datasets.DatasetError(f"{name}: not a data file load_dataset reads by suffix "
                                        f"({', '.join(sorted(_BUILDERS))})")
        ds = load_dataset(builder, data_files=str(path), split=split)
    else:
        ds = load_dataset(name, config, split=split)
    return ds.to_list()


def conversations(w) -> list[list[datasets.Turn]]:
    return datasets.conversations(load_records(w.name, w.config, w.split), f"{w.name} ({w.split})", w.messages_field)


def items(w) -> list[tuple[object, str | None]]:
    """(prompt, reference or None) per record, as kind jsonl gives them."""
    recs = load_records(w.name, w.config, w.split)
    out = [datasets.prompt_item(rec, w.field, w.output_field, f"{w.name} ({w.split}): record {i}")
           for i, rec in enumerate(recs)]
    if not out:
        raise datasets.DatasetError(f"{w.name} ({w.split}): holds no prompts")
    return out


def problems(w, where: str) -> list[str]:
    """Mistakes in an hf workload, and a local dataset that does not load or lacks its columns."""
    if (w.field is None) == (w.messages_field is None):
        return [f"{where}: give exactly one of field (a prompt column) or messages_field (a conversation column)"]
    if w.output_field and not w.field:
        return [f"{where}.output_field: reference outputs go with field (prompts); conversations take each "
                "request's output length from the reply that follows"]
    if not is_local(w.name):
        return []   # a hub id: fetched on the node (matrix.deferred_checks says so)
    try:
        conversations(w) if w.messages_field else items(w)
    except Exception as err:   # datasets raises its own kinds for a dir it cannot read
        return [f"{where}.name: {w.name}: {type(err).__name__}: {err}" if not isinstance(err, datasets.DatasetError)
                else f"{where}.name: {err}"]
    return []
