"""`bench explain --layers`' stored report (orchestrator/store/layers_file.py): written and read back as computed;
a flipped byte in layers.json or in a data page of layers.parquet is a DamagedFile, never another figure."""

import struct

import numpy as np
import pyarrow.parquet as pq
import pytest

from orchestrator.explain.layers import layer_report
from orchestrator.store.integrity import DamagedFile
from orchestrator.store.layers_file import (
    LAYERS_FILE,
    LAYERS_SCHEMA,
    LAYERS_TABLE,
    layers_dir,
    read_layers,
    write_layers,
)


def _report():
    return layer_report(np.array([0.0, 1e-6, 3e-3, 4e-3]), np.array([0.0, 1e-6, 1e-6, 2e-6])) | {"cell_id": "c1"}


def test_round_trip(tmp_path):
    write_layers(tmp_path, "c1", _report())
    report, table = read_layers(tmp_path, "c1")
    assert report["first_beyond"] == 1 and report["line"].startswith("leaves the noise floor at layer 1")
    assert table.column("layer").to_pylist() == [-1, 0, 1, 2]
    assert table.column("beyond_floor").to_pylist() == [False, False, True, True]
    growth = table.column("growth").to_pylist()
    assert growth[0] is None and growth[2] == pytest.approx(3e-3 - 1e-6)
    assert read_layers(tmp_path, "other") is None


@pytest.mark.parametrize("name", [LAYERS_FILE, LAYERS_TABLE])
def test_a_flipped_byte_is_damage(tmp_path, name):
    write_layers(tmp_path, "c1", _report())
    path = layers_dir(tmp_path, "c1") / name
    data = bytearray(path.read_bytes())
    if name == LAYERS_FILE:
        at = data.find(b"first_beyond")
    else:   # the lowest mantissa byte of rel_error 3e-3 in its data page (read unverified: 3e-3 plus one ulp)
        col = pq.ParquetFile(path).metadata.row_group(0).column(LAYERS_SCHEMA.get_field_index("rel_error"))
        at = data.find(struct.pack("<d", 3e-3), col.data_page_offset)
        assert col.data_page_offset < at < col.data_page_offset + col.total_compressed_size
        unverified = bytearray(data)
        unverified[at] ^= 0x01
        path.write_bytes(bytes(unverified))
        assert pq.read_table(path).column("rel_error")[2].as_py() != 3e-3   # what the checksum is there for
    data[at] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(DamagedFile):
        read_layers(tmp_path, "c1")


def test_split_names_and_the_line():
    """Split blocks name their half; quantized embeddings are said first, the first block beyond still counted."""
    errors, noise = np.array([0.0, 0.0, 2e-3, 2.5e-3, 9e-3]), np.zeros(5)
    r = layer_report(errors, noise, split=True)
    assert [x["name"] for x in r["layers"]] == ["embeddings", "block 0 attention", "block 0 FFN", "block 1 attention",
                                                 "block 1 FFN"]
    assert (r["first_beyond"], r["first_part"], r["grows_most"], r["grows_part"]) == (0, "FFN", 1, "FFN")
    assert r["line"] == "leaves the noise floor at layer 0 (FFN), grows most in layer 1 (FFN)"
    r = layer_report(np.array([1e-2, 2e-2, 3e-2]), np.zeros(3))
    assert r["embeddings_beyond"] and r["first_beyond"] == 0
    assert r["line"] == "leaves the noise floor at the embeddings, grows most in layers 0-1"
    assert (r["grows_most"], r["grows_from"], r["grows_to"]) == (0, 0, 1)   # 1e-2 then 1e-2: both blocks
    r = layer_report(np.array([0.0, 1e-3, 9e-3, 1e-2]), np.zeros(4))
    assert r["line"] == "leaves the noise floor at layer 0, grows most in layer 1"   # 1e-3 and 1e-3 < half of 8e-3
    r = layer_report(np.array([0.0, 0.0, 2e-3, 6e-3, 9e-3]), np.zeros(5), split=True)
    assert r["line"] == "leaves the noise floor at layer 0 (FFN), grows most in layer 0 (FFN) to layer 1 (FFN)"
