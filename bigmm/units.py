"""Element types and their rules, and parsing and formatting of sizes, rates and durations (pure
helpers, no I/O; NumPy is imported only by :func:`numpy_dtype`)."""

from __future__ import annotations

import numbers
import re
import time

from .errors import DtypeError, OptionError, SizeParseError

#: The element types bigmm reads, moves, multiplies and writes, by name, with their sizes in
#: bytes (bfloat16 is ml_dtypes' type on the NumPy side; see the README for HDF5).
DTYPES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
#: Half-precision operands: multiplied with float32 accumulation (tensor cores on a GPU, float32
#: on the CPU); C in float32 unless asked for in the operands' dtype.
HALF_DTYPES = ("float16", "bfloat16")
#: Operands multiplied in their own dtype (bigmm's own kernels, cuBLAS S/DGEMM, BLAS).
WIDE_DTYPES = ("float32", "float64")


def accumulate_dtype(name: str) -> str:
    """The dtype products of ``name`` operands accumulate in (and C has on the compute side):
    float32 for half precision, else the dtype itself."""
    return "float32" if name in HALF_DTYPES else name


def common_dtype(a: str, b: str) -> str:
    """The dtype A and B are multiplied in: NumPy's ``result_type`` of the two (float32 @
    float64 is float64, float16 @ float32 is float32), and float32 for float16 with bfloat16,
    which have no common 16-bit type. Panels of the other dtype are converted as they load."""
    for name in (a, b):
        if name not in DTYPES:
            raise DtypeError(f"Expected dtypes among {', '.join(DTYPES)}. Got {name!r}.")
    if a == b:
        return a
    if a in HALF_DTYPES and b in HALF_DTYPES:
        return "float32"
    return max(a, b, key=lambda name: DTYPES[name])


def out_dtypes(operands: str) -> tuple[str, ...]:
    """The dtypes C may be asked for (``out_dtype=``) for operands multiplied in ``operands``:
    the accumulation dtype (the default), and for half precision the operands' dtype too."""
    acc = accumulate_dtype(operands)
    return (acc,) if acc == operands else (acc, operands)


def parse_out_dtype(out_dtype, operands: str) -> str:
    """C's dtype for a new output: ``out_dtype`` (a name or NumPy dtype; None: the default,
    float32 for half-precision operands, else their dtype), one of :func:`out_dtypes`."""
    allowed = out_dtypes(operands)
    if out_dtype is None:
        return allowed[0]
    name = dtype_name(out_dtype)
    if name not in allowed:
        raise OptionError(f"Expected {' or '.join(f'out_dtype={d}' for d in allowed)} for "
                          f"operands multiplied in {operands}. Got {out_dtype!r}.")
    return name


def numpy_dtype(name: str):
    """The NumPy dtype of a :data:`DTYPES` name (bfloat16: ml_dtypes'), native byte order."""
    import numpy as np

    if name not in DTYPES:
        raise DtypeError(f"Expected a dtype among {', '.join(DTYPES)}. Got {name!r}.")
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def dtype_name(dtype) -> str | None:
    """The :data:`DTYPES` name of a NumPy dtype (or its name) in either byte order, or None."""
    import numpy as np

    if isinstance(dtype, str) and dtype in DTYPES:
        return dtype
    try:
        dt = np.dtype(dtype)
    except TypeError:
        return None
    if dt.names or dt.subdtype:
        return None
    if dt.kind == "f":
        name = dt.newbyteorder("=").name
        return name if name in DTYPES else None
    return "bfloat16" if dt.name == "bfloat16" else None

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2,
    "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


#: The largest size taken (bytes): 2**62, a few exbibytes.
MAX_SIZE = 1 << 62


def parse_size(value: int | float | str | None, *, name: str = "size") -> int | None:
    """Bytes from an int or a string such as "8GiB", "512MB", "1e9", "4096". None stays None."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise SizeParseError(f"Expected {name} as bytes or a string like '8GiB'. Got {value!r}.")
    if isinstance(value, numbers.Real):  # NumPy's integers and floats too
        return _checked(value, value, name)
    if isinstance(value, str):
        text = value.strip()
        try:
            number = float(text)
        except ValueError:
            match = _SIZE.match(text)
            unit = match.group(2).lower() if match else None
            if not match or unit not in _UNITS:
                raise SizeParseError(
                    f"Expected {name} like '8GiB', '512MB' or a number of bytes. Got {value!r}."
                ) from None
            number = float(match.group(1)) * _UNITS[unit]
        return _checked(number, value, name)
    raise SizeParseError(f"Expected {name} as bytes or a string like '8GiB'. Got {value!r}.")


def _checked(number, value, name: str) -> int:
    """``number`` (from ``value``) as whole bytes: finite, above 0, at most MAX_SIZE."""
    if number != number or number in (float("inf"), float("-inf")):
        raise SizeParseError(f"Expected {name} as a finite number of bytes. Got {value!r}.")
    if number <= 0:
        raise SizeParseError(f"Expected {name} > 0 bytes. Got {value!r}.")
    if number > MAX_SIZE:
        raise SizeParseError(f"Expected {name} of at most {MAX_SIZE} bytes (4 EiB). "
                             f"Got {value!r}.")
    if number < 1:  # a fraction of a byte: 0 once whole
        raise SizeParseError(f"Expected {name} of at least 1 byte. Got {value!r}.")
    return int(number)


def format_bytes(n: float) -> str:
    """1536 -> '1.50 KiB'."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_seconds(s: float) -> str:
    """12.3 -> '12.3 s', 4000 -> '1h06m40s'."""
    if s < 1e-3:
        return f"{s * 1e6:.0f} us"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    if s < 120:
        return f"{s:.1f} s"
    m, sec = divmod(int(round(s)), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else f"{m}m{sec:02d}s"


def format_time_ns(ns: int) -> str:
    """A file time in nanoseconds since the epoch as local date and time, to the nanosecond."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ns / 1e9)) + f".{ns % 10**9:09d}"


def format_rate(flops: float, seconds: float) -> str:
    """Throughput in TFLOP/s or GFLOP/s."""
    if seconds <= 0:
        return "n/a"
    r = flops / seconds
    return f"{r / 1e12:.2f} TFLOP/s" if r >= 1e12 else f"{r / 1e9:.1f} GFLOP/s"


def parse_seed(seed) -> int:
    """A random seed as NumPy's generators take it: an integer from 0 to 2**64 - 1 (what HDF5
    can store with the matrix); OptionError otherwise."""
    if (isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0
            or seed >= 2**64):
        raise OptionError(f"Expected seed to be an integer from 0 to 2**64 - 1. Got {seed!r}.")
    return int(seed)
