"""The arithmetic of float32 products (``precision=``), and the rounding each one commits.

Three precisions name the arithmetic, not the library:

* "float32" (the default): IEEE float32 fused multiply-adds, on the CUDA cores of a GPU;
* "tf32x3": the TF32 tensor cores in three passes over a big + small split of each operand
  (a = big + small, big and small TF32 numbers; big*big + big*small + small*big summed in
  float32): float32's accuracy at tensor-core speed;
* "tf32": one TF32 pass, each operand rounded to 11 significant bits (about 1e-4 relative
  error in a product, 3e-4 in a long sum).

They apply to float32 products only: float64 operands run in float64 and half-precision ones
on tensor cores already, so another precision with them is an error. On the CPU every float32
product is IEEE float32, whatever the precision (at least as accurate as asked).

:class:`Rounding` is what the checksum bounds (:mod:`bigmm.checksum`) need to know of a
gemm: the epsilon of its additions, how many terms each product adds, and the relative error
of a product from rounding its inputs. Pure: no NumPy, no cupy.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import OptionError

#: Names ``precision=`` takes, the default first.
PRECISIONS = ("float32", "tf32x3", "tf32")
DEFAULT = "float32"
#: What each precision runs on, as the printed plan says it.
ARITHMETIC = {"float32": "IEEE float32 (CUDA cores)",
              "tf32x3": "3xTF32 (float32 accuracy on tensor cores)",
              "tf32": "TF32 (tensor cores; inputs rounded to 11 significant bits)"}
#: Machine epsilon of float32 and of TF32 (10 stored mantissa bits; unit roundoff 2^-11).
EPS32, EPS_TF32 = 2.0 ** -23, 2.0 ** -10


@dataclass(frozen=True)
class Rounding:
    """The rounding of one gemm's arithmetic. ``eps``: machine epsilon of each addition (the
    accumulator's). ``terms``: terms each product adds to the sum (3 for 3xTF32). ``product``:
    bound on the relative error of one product from rounding its inputs before the multiply
    (0 where products are exact before the addition, as in an FMA)."""

    eps: float
    terms: int = 1
    product: float = 0.0


#: Rounding of float32 products per precision. TF32 keeps the top 11 significant bits of
#: each input (rounded or truncated: relative error below 2^-10 each). 3xTF32 represents an
#: input as big + small to within 2^-20 of it, and drops small*small (below 2^-20 of the
#: product): under 3 * 2^-20 + 2^-40, bounded by 2^-18.
ROUNDING = {"float32": Rounding(EPS32),
            "tf32x3": Rounding(EPS32, terms=3, product=2.0 ** -18),
            "tf32": Rounding(EPS32, product=(1 + EPS_TF32) ** 2 - 1)}


def parse_precision(precision) -> str | None:
    """``precision`` as one of PRECISIONS (any case), or None where not given; OptionError
    otherwise."""
    if precision is None:
        return None
    if isinstance(precision, str) and precision.lower() in PRECISIONS:
        return precision.lower()
    raise OptionError(f"Expected precision to be one of {', '.join(PRECISIONS)}. "
                      f"Got {precision!r}.")


def kernel_precision(kernel: str | None, precision) -> str:
    """The precision a GPU kernel choice runs float32 products in: ``precision`` (default
    "float32"); kernel "cublas-tf32" is kernel "cublas" with "tf32" (another precision with
    it is an OptionError), and "cublas" has no float32-accurate tensor-core mode ("tf32x3"
    with it is an OptionError)."""
    asked = parse_precision(precision)
    kernel = kernel.lower() if isinstance(kernel, str) else kernel
    if kernel == "cublas-tf32":
        if asked not in (None, "tf32"):
            raise OptionError(f"Expected precision='tf32' (or none) with kernel='cublas-tf32', "
                              f"which is cuBLAS with TF32. Got precision={asked!r}; use "
                              f"kernel='cublas' or kernel='bigmm' for it.")
        return "tf32"
    if kernel == "cublas" and asked == "tf32x3":
        raise OptionError("Expected precision='float32' or 'tf32' with kernel='cublas' (cuBLAS "
                          "has no float32-accurate tensor-core mode on this GPU). Got "
                          "precision='tf32x3'; use kernel='bigmm' for it.")
    return asked or DEFAULT


def check_dtype(precision: str, dtype: str) -> str:
    """``precision`` for products of ``dtype`` operands: any for float32; only the default
    for others (float64 runs in float64; float16 and bfloat16 on tensor cores already),
    OptionError otherwise."""
    if precision != DEFAULT and dtype != "float32":
        raise OptionError(f"Expected precision='float32' (the default) for {dtype} operands "
                          f"(precision chooses the arithmetic of float32 products). Got "
                          f"precision={precision!r}.")
    return precision


def describe(precision: str, dtype: str, gpu: bool) -> str:
    """The printed plan's "arithmetic" line for products of ``dtype`` operands."""
    if dtype == "float32":
        if gpu:
            return ARITHMETIC[precision]
        text = "IEEE float32 (CPU)"
        if precision != DEFAULT:
            text += f"; {precision} asked: the CPU computes in float32, at least as accurate"
        return text
    if dtype == "float64":
        return "IEEE float64" + ("" if gpu else " (CPU)")
    if gpu:
        return f"{dtype} products on tensor cores, accumulated in float32"
    return f"float32 (CPU; {dtype} operands converted)"
