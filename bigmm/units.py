"""Element types, and parsing and formatting of sizes, rates and durations (pure helpers, no I/O)."""

from __future__ import annotations

import re

from .errors import SizeParseError

#: The element types bigmm computes in, by name, with their sizes in bytes.
DTYPES = {"float32": 4, "float64": 8}

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
    if isinstance(value, (int, float)):
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


def format_rate(flops: float, seconds: float) -> str:
    """Throughput in TFLOP/s or GFLOP/s."""
    if seconds <= 0:
        return "n/a"
    r = flops / seconds
    return f"{r / 1e12:.2f} TFLOP/s" if r >= 1e12 else f"{r / 1e9:.1f} GFLOP/s"
