"""What a Zarr node on disk is, read from its metadata files alone (no zarr module): the v3
``zarr.json`` parsed, and whether a folder holds an array or a group."""

from __future__ import annotations

import json
import os

from ..errors import ReadError

#: A Zarr v3 node's metadata file.
META = "zarr.json"


def read_meta(folder: str) -> dict | None:
    """The parsed ``zarr.json`` in ``folder``; None where there is none; ReadError where it is
    not readable JSON."""
    path = os.path.join(folder, META)
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise ReadError(f"Expected Zarr metadata in '{path}'. Got unreadable JSON: {exc}.") \
            from None
    if not isinstance(value, dict):
        raise ReadError(f"Expected Zarr metadata in '{path}'. Got {type(value).__name__}.")
    return value


def node_type(folder: str) -> str | None:
    """"array" or "group" for the Zarr node in ``folder`` (v3 ``zarr.json``; v2 ``.zarray`` /
    ``.zgroup``), None where there is none."""
    meta = read_meta(folder)
    if meta is not None:
        return str(meta.get("node_type"))
    if os.path.isfile(os.path.join(folder, ".zarray")):
        return "array"
    if os.path.isfile(os.path.join(folder, ".zgroup")):
        return "group"
    return None


def readable_type(folder: str) -> str | None:
    """node_type, or None where the metadata cannot be read (a listing in a message, or a spec
    looking for the groups above it, skips such a node rather than failing on it)."""
    try:
        return node_type(folder)
    except ReadError:
        return None

