"""Every exception bigmm raises.

Each class is rooted in a built-in type as well as :class:`BigmmError`, so callers can catch
either ``bigmm.errors.ShapeError`` or plain ``ValueError``. Messages say what was expected and
what was given ("Expected X. Got Y.").
"""

from __future__ import annotations


class BigmmError(Exception):
    """Base class of all bigmm errors."""


class ShapeError(BigmmError, ValueError):
    """Operands have the wrong rank or incompatible dimensions."""


class DtypeError(BigmmError, TypeError):
    """An operand or output of a dtype bigmm does not take (float16, bfloat16, float32 and
    float64 it does), or an ``out_dtype`` that disagrees with an existing output."""


class SizeParseError(BigmmError, ValueError):
    """A memory size such as "8GiB" could not be parsed."""


class BudgetError(BigmmError, ValueError):
    """A memory budget is below the minimum needed for one tile.

    ``minimum`` holds the smallest budget (bytes) that would work.
    """

    def __init__(self, message: str, minimum: int | None = None):
        super().__init__(message)
        self.minimum = minimum


class PlanError(BigmmError, ValueError):
    """Explicit plan parameters (tile sizes, loop order) are invalid."""


class SpecError(BigmmError, ValueError):
    """An operand spec ("file.h5:/path") is malformed."""


class OperandNotFound(BigmmError, FileNotFoundError):
    """The file or the dataset named by an operand spec does not exist."""


class OutputExistsError(BigmmError, FileExistsError):
    """The output dataset exists and neither overwrite nor resume was asked for."""


class OutputIsInputError(BigmmError, ValueError):
    """The output is one of the inputs, by any route (link, alias, shared memory)."""


class OutputBusyError(BigmmError, BlockingIOError):
    """Another run is writing the output (or another process holds its file locked)."""


class OutputNotWritable(BigmmError, PermissionError):
    """The output file or its directory cannot be written."""


class IncompleteOutputError(BigmmError, RuntimeError):
    """The output was left incomplete by an interrupted run (resume it with ``resume=True``)."""


class ResumeError(BigmmError, RuntimeError):
    """An output cannot be resumed: no journal, a different job, or inputs that changed."""


class ReadError(BigmmError, OSError):
    """Reading an input region failed; the message names the file and the region."""


class WriteError(BigmmError, OSError):
    """Writing an output region failed; the message names the file and the region."""


class DiskFullError(WriteError):
    """The output's filesystem is full; the output stays resumable once space is freed."""


class BackendUnavailable(BigmmError, ImportError):
    """The requested backend cannot be used here (e.g. no GPU or no cupy)."""


class KernelError(BigmmError, RuntimeError):
    """A CUDA kernel could not be compiled or launched, or got arguments it cannot take."""


class VerificationError(BigmmError, ArithmeticError):
    """A product failed verification."""


class Interrupted(BigmmError, KeyboardInterrupt):
    """The run was interrupted; the output is resumable."""


class OptionError(BigmmError, ValueError):
    """An option has a value bigmm does not take (layout, compression, seed, sample count, ...)."""


class UsageError(BigmmError, SystemExit):
    """The ``bigmm`` command line does not parse: an unknown option, a missing operand, a value
    outside an option's choices. A SystemExit of status 2, as argparse's own usage errors."""

    def __init__(self, message: str):
        super().__init__(message)
        self.code = 2


class OutputOverflowError(BigmmError, OverflowError):
    """The product has finite values beyond the largest finite value of C's dtype (float32
    sums asked for as float16, say): written, they would become infinite."""


class OutputTooLarge(BigmmError, MemoryError):
    """The result was asked for as an in-memory array (out=None) and does not fit in memory."""


class ChecksumError(VerificationError):
    """A C tile failed its checksum check again after it was computed a second time."""


class RegisterError(BigmmError, OSError):
    """The driver refused to page-lock a user's array in place (the run then stages it)."""
