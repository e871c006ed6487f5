"""``bigmm gram``: the Gram product C = alpha * A^T A + beta * C (or A A^T) of one operand."""

from __future__ import annotations

from ..precision import PRECISIONS
from ._common import ok_json
from .report import format_summary, print_notes, progress_reporter, run_summary
from .run import backend_name, interrupted, journal_state, note_resumable, output_stamp


def add_parser(sub, common, backends, dtypes) -> None:
    """The ``gram`` command's parser, under ``sub``."""
    g = sub.add_parser("gram", parents=[common], help="C = alpha*A^T@A + beta*C (half the work)",
                       description="The symmetric Gram product of one HDF5 or Zarr matrix out "
                                   "of core: only the tiles on and above the diagonal are "
                                   "computed, the others written as their mirrors.")
    g.add_argument("a", metavar="A", help="operand spec file.h5:/A or store.zarr[:/A]")
    g.add_argument("-o", "--out", required=True, metavar="C",
                   help="output spec file.h5:/C, store.zarr or store.zarr:/C")
    g.add_argument("--aat", action="store_true",
                   help="C = A @ A^T (m x m) instead of A^T @ A (n x n)")
    g.add_argument("--upper", action="store_true",
                   help="write the strictly lower triangle of C as zeros instead of mirroring "
                        "(C records it: verify checks the upper triangle and the zeros)")
    g.add_argument("--plan", action="store_true", help="print the plan only; write nothing")
    g.add_argument("--memory", default=None,
                   help="device memory budget, e.g. 8GiB (default: as multiply's)")
    g.add_argument("--host-memory", default=None,
                   help="host staging budget of a GPU run (default: as multiply's)")
    g.add_argument("--backend", default="auto", choices=backends,
                   help="auto: cupy where a GPU is usable, else numpy (default: %(default)s)")
    g.add_argument("--alpha", type=float, default=1.0,
                   help="C = alpha*A^T@A + beta*C (default: %(default)s)")
    g.add_argument("--beta", type=float, default=0.0,
                   help="beta != 0 reads the existing C, which must be symmetric unless --upper "
                        "(default: %(default)s)")
    g.add_argument("--kernel", default=None, choices=("bigmm", "cublas", "cublas-tf32"),
                   help="GPU tile products (as for multiply); a diagonal tile is one launch "
                        "of bigmm's kernel over its upper blocks, or cuBLAS syrk with cublas")
    g.add_argument("--precision", default=None, type=str.lower, choices=PRECISIONS,
                   help="arithmetic of float32 products (as for multiply)")
    g.add_argument("--out-dtype", default=None, choices=dtypes, help="dtype of a new C")
    g.add_argument("--overwrite", action="store_true", help="replace an existing output")
    g.add_argument("--resume", action="store_true", help="continue an interrupted run")
    g.add_argument("--io-threads", type=int, default=None,
                   help="threads reading and writing the operands (default: as multiply's)")
    g.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    g.add_argument("-q", "--quiet", action="store_true", help="no summary (errors only)")
    g.set_defaults(func=cmd_gram)


def cmd_gram(args) -> int:
    from .. import api

    trans = not args.aat
    kwargs = dict(alpha=args.alpha, beta=args.beta, memory=args.memory,
                  host_memory=args.host_memory, backend=args.backend, kernel=args.kernel,
                  io_threads=args.io_threads)
    if args.out_dtype is not None:
        kwargs["out_dtype"] = args.out_dtype
    if args.precision is not None:
        kwargs["precision"] = args.precision
    plan = api.plan(args.a, args.a, args.out, trans_a=trans, trans_b=not trans, gram=True,
                    upper=args.upper, resume=args.resume, **kwargs)
    if args.plan:
        if args.json:
            ok_json(plan.to_dict())
        else:
            print(plan)
        return 0
    journal, stamp = journal_state(args.out), output_stamp(args.out)
    with progress_reporter(args.quiet, plan.flops) as progress:
        try:
            out, stats = api.gram(args.a, args.out, trans=trans, upper=args.upper,
                                  progress=progress, resume=args.resume,
                                  overwrite=args.overwrite, stats=True, **kwargs)
        except KeyboardInterrupt as e:
            return interrupted(args, progress, e, journal, stamp)
        except Exception as e:
            note_resumable(args, journal, e)
            raise
    summary = run_summary(plan, stats, out, args.a, args.a, backend_name(args.backend))
    summary["gram"] = {"form": "A^T A" if trans else "A A^T", "upper": bool(args.upper)}
    print_notes(summary, args.quiet)
    if args.json:
        ok_json(summary)
    elif not args.quiet:
        print(format_summary(summary))
    return 0
