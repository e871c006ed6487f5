"""Operand specs: ``"path/to/file.h5:/group/dataset"`` -> :class:`Spec`."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import SpecError


@dataclass(frozen=True)
class Spec:
    """An HDF5 dataset named by file path and absolute dataset path (always with a leading "/")."""

    path: str
    dataset: str

    def __str__(self) -> str:
        return f"{self.path}:{self.dataset}"


def parse_spec(text) -> Spec:
    """Parse ``"file.h5:/dataset"`` (a string or a path such as ``Path("file.h5:/dataset")``;
    the leading "/" of the dataset is optional).

    The file part ends at the first ``":/"``; without one, at the last ``":"``. Both parts must
    be non-empty.
    """
    if isinstance(text, Spec):
        return text
    if isinstance(text, os.PathLike):
        text = os.fspath(text)
    if not isinstance(text, str):
        raise SpecError(f"Expected 'file.h5:/dataset'. Got {text!r} ({type(text).__name__}).")
    cut = text.find(":/")
    if cut < 0:
        cut = text.rfind(":")
    path, dataset = (text[:cut], text[cut + 1:]) if cut >= 0 else ("", "")
    dataset = "/" + dataset.strip().lstrip("/")
    path = path.strip()
    if not path or dataset == "/" or "//" in dataset or dataset.endswith("/"):
        raise SpecError(f"Expected 'file.h5:/dataset'. Got {text!r}.")
    return Spec(path, dataset)
