"""The command line's parser: commands, operands and options."""

from __future__ import annotations

import argparse
import sys

from .. import __version__
from ..errors import UsageError
from ..precision import PRECISIONS
from ..units import DTYPES

BACKENDS = ("auto", "numpy", "cupy")
from . import calibrate, gram
from .run import cmd_multiply, cmd_plan
from .tools import cmd_bench, cmd_demo, cmd_generate, cmd_verify


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line, like every other error, and raises
    it as a UsageError (for the ``--json`` answer)."""

    def error(self, message):
        message = f"{message} (see {self.prog} --help)"
        self._print_message(f"{self.prog}: error: {message}\n", sys.stderr)
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an error")
    p = _Parser(prog="bigmm", parents=[common],
                description="Out-of-core matrix multiplication of HDF5 and Zarr matrices.")
    p.add_argument("--version", action="version", version=f"bigmm {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    m = sub.add_parser("multiply", parents=[common], help="C = alpha*op(A)@op(B) + beta*C",
                       description="Multiply two HDF5 or Zarr matrices out of core.")
    _operands(m)
    m.add_argument("-o", "--out", required=True, metavar="C",
                   help="output spec file.h5:/C, store.zarr or store.zarr:/C")
    _job_options(m)
    m.add_argument("--overwrite", action="store_true", help="replace an existing output")
    m.add_argument("--resume", action="store_true", help="continue an interrupted run")
    m.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    m.add_argument("--verify", default=None, choices=("checksum",),
                   help="check every C tile with checksums and recompute a tile that fails")
    m.add_argument("-q", "--quiet", action="store_true", help="no summary (errors only)")
    m.add_argument("--profile", nargs="?", const=True, default=None, metavar="PREFIX",
                   help="time each stage; print its utilisation and write PREFIX.trace.json "
                        "(Perfetto) and, where matplotlib is installed, PREFIX.png (default "
                        "PREFIX: the output file + .profile)")
    m.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="run the tiles on the dask cluster at ADDRESS (tcp://host:8786)")
    m.add_argument("--workers", type=int, default=None, metavar="N",
                   help="run the tiles on a new local dask cluster of N workers "
                        "(one per GPU where GPUs are usable; at most 4 per CPU core)")
    m.set_defaults(func=cmd_multiply)

    pl = sub.add_parser(
        "plan", parents=[common], help="dry run: print the plan, write nothing",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Print the schedule and the predicted time; write nothing.",
        epilog="How to read it:\n"
               "  C tiles       C is computed in tiles of bm x bn, each kept on the device while\n"
               "                it accumulates over K\n"
               "  K panels      each tile's depth K in panels of bk: a panel of A (bm x bk) and of\n"
               "                B (bk x bn) per step\n"
               "  loop order    stream: A and B panels read for every tile; resident-a/-b: a row\n"
               "                panel of A (column panel of B) stays on the device while the other\n"
               "                operand's panels stream past it; resident-c: every C tile\n"
               "                stays while K panels stream; whole-a/-b: all of A (B) stays,\n"
               "                C's first tiles done early\n"
               "  slots         buffers on the device (and in pinned host memory) per operand:\n"
               "                two or more let the next panel load while one computes\n"
               "  read          bytes read from A and B (x2: each read twice)\n"
               "  lower bound   the fewest bytes any schedule under this budget must read\n"
               "                (Hong & Kung), or reading each input once if that is more")
    _operands(pl)
    pl.add_argument("-o", "--out", default=None, metavar="C", help="output spec (optional)")
    _job_options(pl)
    pl.add_argument("--json", action="store_true", help="print the plan as JSON")
    pl.add_argument("--verify", default=None, choices=("checksum",),
                    help="plan for a run with checksums (their time counts on a GPU)")
    pl.add_argument("--resume", action="store_true",
                    help="the plan of resuming an interrupted run into -o C: its journal's "
                         "schedule and how many tiles it holds (another job is refused, as a "
                         "resume refuses it)")
    pl.set_defaults(func=cmd_plan)

    gram.add_parser(sub, common, BACKENDS, tuple(DTYPES))
    calibrate.add_parser(sub, common, BACKENDS, tuple(DTYPES))

    g = sub.add_parser("generate", parents=[common], help="write a seeded random matrix",
                       description="Write a seeded standard-normal matrix to HDF5 or Zarr.")
    g.add_argument("spec", help="output spec file.h5:/A, store.zarr or store.zarr:/A")
    g.add_argument("--shape", nargs=2, type=int, required=True, metavar=("M", "N"),
                   help="rows and columns")
    g.add_argument("--dtype", default="float32", choices=tuple(DTYPES),
                   help="element type (default: %(default)s)")
    g.add_argument("--layout", default=None, choices=("contiguous", "chunked", "compressed"),
                   help="storage (default: compressed with --compression, chunked with "
                        "--chunks, else contiguous; a Zarr array is always chunked)")
    g.add_argument("--chunks", nargs=2, type=int, default=None, metavar=("R", "C"),
                   help="chunk shape of a chunked or compressed layout (default: 512 x 512, "
                        "each edge at most the matrix's)")
    g.add_argument("--compression", default=None, choices=("gzip", "zstd", "lz4", "blosc"),
                   help="codec of the compressed layout (default there: gzip for HDF5, which "
                        "takes gzip, zstd, lz4; zstd for Zarr, which takes zstd, blosc, gzip)")
    g.add_argument("--seed", type=int, default=0,
                   help="random seed: one seed, one matrix (default: %(default)s)")
    g.add_argument("--overwrite", action="store_true", help="replace an existing dataset")
    g.set_defaults(func=cmd_generate)

    v = sub.add_parser("verify", parents=[common], help="check C against A@B (exit 0 pass, 1 fail)",
                       description="Check C = alpha*op(A)@op(B) + beta*C0 in float64. A C "
                                   "written by gram --upper (its record says so) is checked "
                                   "as it is: the upper triangle, and zeros below. "
                                   "Exit 0: pass, 1: fail, 2: error.")
    _operands(v)
    v.add_argument("c", metavar="C", help="product spec file.h5:/C or store.zarr[:/C]")
    v.add_argument("--alpha", type=float, default=1.0, help="as multiplied (default: %(default)s)")
    v.add_argument("--beta", type=float, default=0.0, help="as multiplied (default: %(default)s)")
    v.add_argument("--c0", default=None, help="C before the run (needed when beta != 0)")
    v.add_argument("--trans-a", action="store_true", help="A was used transposed")
    v.add_argument("--trans-b", action="store_true", help="B was used transposed")
    v.add_argument("--upper", action="store_true", default=None,
                   help="C holds the upper triangle of the product, zeros below, as gram "
                        "--upper writes it (default: as C's record says)")
    v.add_argument("--samples", type=int, default=None,
                   help="whole rows of C recomputed in sampled mode (default: 16)")
    v.add_argument("--probes", type=int, default=None,
                   help="Freivalds vectors in sampled mode (default: 4)")
    v.add_argument("--exact-limit", type=int, default=None,
                   help="largest M*N*K checked element by element; larger products are "
                        "sampled (default: 1000000000)")
    v.add_argument("--seed", type=int, default=0,
                   help="seed of the sampled rows and probe vectors (default: %(default)s)")
    v.add_argument("--precision", default=None, type=str.lower, choices=PRECISIONS,
                   help="the arithmetic C was multiplied in (as given to multiply; tf32 "
                        "widens the tolerance by its rounding of the inputs)")
    v.add_argument("--json", action="store_true",
                   help="print the result as JSON on stdout (ok false where C fails)")
    v.set_defaults(func=cmd_verify)

    d = sub.add_parser("demo", parents=[common], help="generate, multiply out of core, verify",
                       description="Generate A and B, multiply them under a small memory budget, "
                                   "verify the product and print the throughput.")
    d.add_argument("--size", type=int, default=3000,
                   help="n for n x n operands (default: %(default)s)")
    d.add_argument("--memory", default=None,
                   help="device budget (default: an eighth of the inputs' size)")
    d.add_argument("--backend", default="auto", choices=BACKENDS,
                   help="auto: cupy where a GPU is usable (default: %(default)s)")
    d.add_argument("--dir", default=None, help="keep the files in this directory")
    d.set_defaults(func=cmd_demo)

    b = sub.add_parser("bench", parents=[common], help="time bigmm against an in-core gemm",
                       description="Time one out-of-core multiply (HDF5 to HDF5) against one "
                                   "in-core gemm of the same data on the same backend; the "
                                   "bigmm product is verified.")
    b.add_argument("--size", type=int, default=4000,
                   help="n for n x n operands (default: %(default)s)")
    b.add_argument("--dtype", default="float32", choices=tuple(DTYPES),
                   help="element type (default: %(default)s)")
    b.add_argument("--memory", default=None, help="device budget (default: a quarter of the inputs)")
    b.add_argument("--backend", default="auto", choices=BACKENDS,
                   help="auto: cupy where a GPU is usable (default: %(default)s)")
    b.add_argument("--kernel", default=None, choices=("bigmm", "cublas", "cublas-tf32"),
                   help="GPU tile products (as for multiply)")
    _precision(b)
    b.add_argument("--dir", default=None, help="directory for the operands (default: a temp dir)")
    b.add_argument("--json", action="store_true", help="print the timings as JSON on stdout")
    b.set_defaults(func=cmd_bench)
    return p


def _operands(p) -> None:
    p.add_argument("a", metavar="A", help="left operand spec file.h5:/A or store.zarr[:/A]")
    p.add_argument("b", metavar="B", help="right operand spec file.h5:/B or store.zarr[:/B]")


def _job_options(p) -> None:
    p.add_argument("--memory", default=None,
                   help="device memory budget, e.g. 8GiB or 512MB (default: 85%% of the GPU's "
                        "free memory; on the CPU 25%% of available RAM)")
    p.add_argument("--host-memory", default=None,
                   help="host staging budget of a GPU run, e.g. 16GiB (default: 25%% of "
                        "available RAM)")
    p.add_argument("--backend", default="auto", choices=BACKENDS,
                   help="auto: cupy where a GPU is usable, else numpy (default: %(default)s)")
    p.add_argument("--alpha", type=float, default=1.0,
                   help="C = alpha*op(A)@op(B) + beta*C (default: %(default)s)")
    p.add_argument("--beta", type=float, default=0.0,
                   help="beta != 0 reads the existing C (default: %(default)s)")
    p.add_argument("--trans-a", action="store_true", help="use A transposed")
    p.add_argument("--trans-b", action="store_true", help="use B transposed")
    p.add_argument("--io-threads", type=int, default=None,
                   help="threads reading and writing the operands (default: one per CPU core, "
                        "2 to 16); on a GPU the plan depends on them")
    p.add_argument("--kernel", default=None, choices=("bigmm", "cublas", "cublas-tf32"),
                   help="GPU tile products: bigmm's kernel (default), cublas, or cublas-tf32 "
                        "(cublas with --precision tf32)")
    _precision(p)
    p.add_argument("--out-dtype", default=None, choices=tuple(DTYPES),
                   help="dtype of a new C: float32 (the default) or the operands' dtype for "
                        "float16 and bfloat16 operands; mixed operands give NumPy's result "
                        "type; an existing C keeps its own")


def _precision(p) -> None:
    p.add_argument("--precision", default=None, type=str.lower, choices=PRECISIONS,
                   help="arithmetic of float32 products: float32 (IEEE on CUDA cores, the "
                        "default), tf32x3 (float32 accuracy on TF32 tensor cores, kernel "
                        "bigmm), tf32 (one TF32 pass, about 3e-4 relative error); the CPU "
                        "computes in float32 whatever it says")
