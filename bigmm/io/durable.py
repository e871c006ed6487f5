"""Making a file's bytes, or a directory entry, durable by path (``fsync``), and the room
there is for them."""

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


def free_bytes(path: str) -> int | None:
    """Bytes free to this user on the file system that holds (or would hold) the file
    ``path``; None where that is not known (no such folder, or a file system that says none)."""
    try:
        st = os.statvfs(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return None
    return st.f_bavail * st.f_frsize if st.f_blocks else None
