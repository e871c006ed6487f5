"""One writer per output: an exclusive ``flock`` on a small lock file beside the output.

The kernel releases an ``flock`` when its process dies, so a run killed with SIGKILL never
blocks its own resume. The lock file holds the owner's PID (for the message a second run
gets) and is removed on release: the owner unlinks it while still holding the lock, and an
acquirer that locked a file no longer at the path (unlinked under it) tries again.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time

from ..errors import OutputBusyError, OutputNotWritable

#: How long to wait for HDF5's own lock on a file that another run opens for a moment (to
#: create its dataset or mark it complete) before calling the file busy.
H5_LOCK_WAIT = 30.0


class OutputLock:
    """The exclusive lock of one output, taken on construction; :meth:`release` gives it up."""

    def __init__(self, path: str, label: str):
        self.path, self.label = path, label
        self._fd = None
        while self._fd is None:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                raise OutputBusyError(
                    f"Expected no other bigmm run writing {label}. Got one{self._owner()} "
                    f"holding '{path}'; wait for it to finish (or stop it), then run again "
                    f"(with resume=True to keep its finished tiles).") from None
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                same = False
            if same:
                self._fd = fd
            else:  # unlinked by a releasing owner after we opened it: take the new file
                os.close(fd)
        os.ftruncate(self._fd, 0)
        os.write(self._fd, f"{os.getpid()}\n".encode())

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError as exc:
            raise OutputNotWritable(f"Expected to create the lock file '{self.path}' of "
                                    f"{self.label}. Got {type(exc).__name__}: {exc}.") from exc

    def _owner(self) -> str:
        try:
            with open(self.path) as f:
                pid = f.read().strip()
        except OSError:
            return ""
        return f" (PID {pid})" if pid.isdigit() else ""

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Remove the lock file and give the lock up; idempotent."""
        if self._fd is None:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None


def h5_open_retry(open_fn, path: str, label: str, wait: float | None = None):
    """``open_fn()`` (an h5py.File open for writing), retried while HDF5's own file lock is held
    by another process (another run creating its dataset in the same file); after ``wait``
    seconds (default H5_LOCK_WAIT) an OutputBusyError names the file."""
    wait = H5_LOCK_WAIT if wait is None else wait
    deadline = time.monotonic() + wait
    delay = 0.01
    while True:
        try:
            return open_fn()
        except (BlockingIOError, OSError) as exc:
            if getattr(exc, "errno", None) == errno.EEXIST and time.monotonic() <= deadline:
                # mode "a" on a new file: another process created it between this open's
                # attempt to open it and its exclusive create; open it again
                continue
            if not _locked(exc) or time.monotonic() > deadline:
                if _locked(exc):
                    raise OutputBusyError(
                        f"Expected to open '{path}' for writing {label}. Got it locked by "
                        f"another process (an HDF5 reader or writer holds it open) for "
                        f"{wait:.0f} s.") from None
                raise
            time.sleep(delay)
            delay = min(0.25, delay * 2)


def _locked(exc: BaseException) -> bool:
    if isinstance(exc, BlockingIOError) or getattr(exc, "errno", None) in (errno.EAGAIN,
                                                                            errno.EWOULDBLOCK):
        return True
    text = str(exc).lower()
    return "unable to lock file" in text or "resource temporarily unavailable" in text
