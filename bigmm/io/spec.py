"""Operand specs: ``"file.h5:/group/dataset"``, ``"store.zarr"`` or ``"store.zarr:/group/array"``
-> :class:`Spec`.

Grammar. A spec names an HDF5 dataset or a Zarr array:

* ``file.h5:/group/dataset`` (HDF5): the file part ends at the first ``":/"``, else at the last
  ``":"``; the leading "/" of the dataset is optional; both parts must be non-empty.
* ``store.zarr`` (Zarr): the array at the root of the store.
* ``store.zarr:/group/array`` (Zarr): the array at that path inside the store (no empty or
  ``..`` names, nor those Zarr keeps: ``zarr.json`` and v2's metadata names, ``__...``).

A spec is Zarr when its store part ends with ``.zarr`` (any case, a trailing "/" allowed) or is
an existing directory holding Zarr metadata (``zarr.json``); a whole spec that is such a path
names the root array (so ``store.zarr/group/array``, the array's own directory, works too).
Anything else is HDF5, as before: a new Zarr store needs the ``.zarr`` suffix.

A Zarr spec is named from the outermost group that holds it: ``store.zarr/group/array`` (when
``store.zarr`` and ``group`` are groups) is ``store.zarr:/group/array``, so that every spelling
of one array finds one lock and one journal.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import SpecError
from .zarrmeta import readable_type

HDF5, ZARR = "hdf5", "zarr"


@dataclass(frozen=True)
class Spec:
    """An HDF5 dataset (file path and absolute dataset path, always with a leading "/") or,
    with ``kind="zarr"``, a Zarr array (store directory and array path, "/" for the root)."""

    path: str
    dataset: str
    kind: str = HDF5

    @property
    def zarr(self) -> bool:
        return self.kind == ZARR

    def __str__(self) -> str:
        if self.zarr and self.dataset == "/":
            return self.path
        return f"{self.path}:{self.dataset}"


#: Metadata files one of which the root of an existing Zarr store holds (v3; v2 group, array).
ZARR_META = ("zarr.json", ".zgroup", ".zarray")


def is_zarr_path(path: str) -> bool:
    """Whether ``path`` names a Zarr store: ``*.zarr`` (any case), or an existing directory
    holding Zarr metadata."""
    path = path.strip()
    if path.rstrip("/").lower().endswith(".zarr"):
        return True
    return os.path.isdir(path) and any(os.path.isfile(os.path.join(path, m)) for m in ZARR_META)


def parse_spec(text) -> Spec:
    """Parse a spec (a string or a path such as ``Path("file.h5:/dataset")``); see the module
    docstring for the grammar."""
    if isinstance(text, Spec):
        return _checked(text)
    if isinstance(text, os.PathLike):
        text = os.fspath(text)
    if not isinstance(text, str):
        raise SpecError(f"Expected 'file.h5:/dataset' or 'store.zarr[:/array]'. Got {text!r} "
                        f"({type(text).__name__}).")
    if text.strip() and is_zarr_path(text):
        return Spec(*_outermost(_store(text), "/"), ZARR)
    cut = text.find(":/")
    if cut < 0:
        cut = text.rfind(":")
    path, dataset = (text[:cut], text[cut + 1:]) if cut >= 0 else ("", "")
    path = path.strip()
    dataset = _without_dots(dataset)
    if path and is_zarr_path(path):
        array = "/" + dataset.strip().strip("/")
        if "//" in array or any(map(_reserved, array.split("/"))):
            raise SpecError(f"Expected 'store.zarr:/group/array' (no empty or '..' names, nor "
                            f"names Zarr keeps for itself: its metadata files, '__...'). Got "
                            f"{text!r}.")
        return Spec(*_outermost(_store(path), array), ZARR)
    dataset = "/" + dataset.strip().lstrip("/")
    if not path or dataset == "/" or "//" in dataset or dataset.endswith("/"):
        raise SpecError(f"Expected 'file.h5:/dataset' or 'store.zarr[:/array]'. Got {text!r}.")
    return Spec(path, dataset)


def _checked(spec: Spec) -> Spec:
    """A Spec made directly, held to the grammar: a path, a dataset (not the root) or an array
    path (no names Zarr refuses or keeps: :func:`_reserved`), a leading "/" added."""
    name = "/" + str(spec.dataset).lstrip("/")  # (spaces kept: an h5py object's name)
    bad = (spec.kind not in (HDF5, ZARR) or not isinstance(spec.path, str)
           or not spec.path.strip() or "//" in name
           or (spec.kind == ZARR and any(map(_reserved, name.split("/"))))
           or (spec.kind == HDF5 and (name == "/" or name.endswith("/"))))
    if bad:
        raise SpecError(f"Expected a Spec of a file and a dataset, or a Zarr store and an array "
                        f"('file.h5:/dataset', 'store.zarr[:/array]'). Got {spec!r}.")
    return spec if name == spec.dataset else Spec(spec.path, name, spec.kind)


def _reserved(name: str) -> bool:
    """Whether a Zarr node cannot have ``name``: the parent's '..', a metadata file's name
    (an array "zarr.json" would take its group's metadata file's place) or one the Zarr v3
    spec reserves ('__' first)."""
    return name == ".." or name in ZARR_META + (".zattrs", ".zmetadata") or name.startswith("__")


def _without_dots(name: str) -> str:
    """``name`` without its "." components ("/./C" is "/C", as HDF5 and Zarr resolve it), so
    that every spelling of one output names one lock and one journal."""
    parts = name.split("/")
    kept = [p for p in parts if p.strip() != "."]
    return name if len(kept) == len(parts) else "/".join(kept)


def _store(path: str) -> str:
    path = path.strip()
    return path.rstrip("/") or path


def _outermost(store: str, array: str) -> tuple[str, str]:
    """(store, array) named from the outermost Zarr group above ``store`` (itself where the
    folder above it is no group)."""
    while True:
        full = os.path.abspath(store)
        parent = os.path.dirname(full)
        if parent == full or not _is_group(parent):
            return store, array
        array = "/" + os.path.basename(full) + ("" if array == "/" else array)
        store = os.path.dirname(store) or parent


def _is_group(folder: str) -> bool:
    """Whether ``folder`` holds a Zarr group (v3 ``zarr.json``, v2 ``.zgroup``)."""
    return readable_type(folder) == "group"
