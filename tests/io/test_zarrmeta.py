"""What a Zarr node on disk is, read from its metadata files (bigmm.io.zarrmeta)."""

import json

import numpy as np
import pytest

from bigmm.errors import ReadError
from bigmm.io.zarrmeta import META, node_type, read_meta, readable_type

zarr = pytest.importorskip("zarr")


def test_a_v3_array_and_its_group_are_told_apart(tmp_path):
    root = zarr.open_group(str(tmp_path / "s.zarr"), mode="w", zarr_format=3)
    root.create_array("x", shape=(3, 5), chunks=(2, 2), dtype="f4")[:] = np.ones((3, 5))
    assert node_type(str(tmp_path / "s.zarr")) == "group"
    assert node_type(str(tmp_path / "s.zarr" / "x")) == "array"
    assert read_meta(str(tmp_path / "s.zarr" / "x"))["shape"] == [3, 5]


@pytest.mark.parametrize("name, kind", [
    (".zarray", "array"),  # a v2 array
    (".zgroup", "group"),  # a v2 group
])
def test_v2_nodes_are_known_by_their_files(tmp_path, name, kind):
    (tmp_path / name).write_text("{}")
    assert node_type(str(tmp_path)) == kind
    assert read_meta(str(tmp_path)) is None


def test_a_folder_without_metadata_is_no_node(tmp_path):
    assert node_type(str(tmp_path)) is None
    assert node_type(str(tmp_path / "missing")) is None


@pytest.mark.parametrize("text", [
    "{not json",  # unreadable
    json.dumps([1, 2]),  # JSON, but not an object
])
def test_bad_metadata_is_a_read_error_and_unreadable_to_listings(tmp_path, text):
    (tmp_path / META).write_text(text)
    with pytest.raises(ReadError, match="Expected Zarr metadata"):
        node_type(str(tmp_path))
    assert readable_type(str(tmp_path)) is None
