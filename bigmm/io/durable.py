"""Making a file's bytes, or a directory entry, durable by path (``fsync``)."""

from __future__ import annotations

import os


def fsync_path(path: str) -> None:
    """fsync the file or directory at ``path``."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str) -> None:
    """fsync the directory holding ``path`` (a file created, renamed or removed there)."""
    fsync_path(os.path.dirname(os.path.abspath(path)) or ".")
