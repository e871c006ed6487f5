"""``bigmm generate``, ``verify``, ``demo`` and ``bench``."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from ..errors import OptionError, OutputNotWritable
from ..units import DTYPES, format_bytes, format_seconds, parse_size
from ._common import EXIT_FAIL, fail_json, ok_json
from .report import format_summary, progress_reporter, run_summary
from .run import backend_info, backend_name


def cmd_generate(args) -> int:
    from ..io.generate import describe_layout, generate, parse_layout, parse_shape
    from ..io.spec import parse_spec

    t0 = time.perf_counter()
    chunks = tuple(args.chunks) if args.chunks else None
    spec = generate(args.spec, tuple(args.shape), dtype=args.dtype, layout=args.layout,
                    chunks=chunks, compression=args.compression, seed=args.seed,
                    overwrite=args.overwrite)
    m, n = parse_shape(args.shape)
    lay = describe_layout(parse_layout(args.layout, chunks, args.compression, (m, n),
                                       zarr=parse_spec(args.spec).zarr))
    size = m * n * DTYPES[args.dtype]
    print(f"wrote {spec}: {m} x {n} {args.dtype}, {lay}, {format_bytes(size)}, "
          f"seed {args.seed}, in {format_seconds(time.perf_counter() - t0)}")
    return 0


def cmd_verify(args) -> int:
    from ..verify import verify

    kwargs = {}
    for name in ("samples", "probes", "exact_limit"):
        if getattr(args, name) is not None:
            kwargs[name] = getattr(args, name)
    result = verify(args.a, args.b, args.c, alpha=args.alpha, beta=args.beta, c0=args.c0,
                    trans_a=args.trans_a, trans_b=args.trans_b, seed=args.seed,
                    precision=args.precision, upper=args.upper, **kwargs)
    if args.json:
        _answer(args, result, result.to_dict())
    else:
        print(result)
    return 0 if result.passed else EXIT_FAIL


def _answer(args, check, summary: dict) -> None:
    """The --json answer of a command that verified a product (``check``): ``ok`` as it
    passed; a product that failed is the error (a VerificationError), exit status 1."""
    if check.passed:
        ok_json(summary)
    else:
        fail_json(args, EXIT_FAIL, str(check), "VerificationError", **summary)


def cmd_demo(args) -> int:
    from .. import api
    from ..io.generate import generate
    from ..verify import verify

    n = _positive(args.size, "--size")
    with _workdir(args.dir) as d:
        a, b, c = (f"{d / 'demo.h5'}:/{x}" for x in "ABC")
        t0 = time.perf_counter()
        for spec, seed in ((a, 1), (b, 2)):
            generate(spec, (n, n), dtype="float32", seed=seed, overwrite=True)
        print(f"generated A and B: {n} x {n} float32 ({format_bytes(2 * 4 * n * n)}) in "
              f"{format_seconds(time.perf_counter() - t0)}")
        memory = args.memory or max(2 * 4 * n * n // 8, 1 << 20)
        plan = api.plan(a, b, memory=memory, backend=args.backend)
        print(plan, end="\n\n")
        with progress_reporter(False) as progress:
            out, stats = api.matmul(a, b, c, memory=memory, backend=args.backend,
                                    progress=progress, overwrite=True, stats=True)
        name, device = backend_info(args.backend)
        s = run_summary(plan, stats, out, a, b, name)
        print(format_summary(s))
        t0 = time.perf_counter()
        result = verify(a, b, c)
        print(f"verify: {result} in {format_seconds(time.perf_counter() - t0)}")
        where = f"files kept in {d}" if args.dir else "temporary files removed"
        print(f"demo {'passed' if result.passed else 'FAILED'}: "
              f"{s['tflops']:.3f} TFLOP/s, {s['gbps']:.2f} GB/s on {name}, {device}; {where}")
    return 0 if result.passed else EXIT_FAIL


def cmd_bench(args) -> int:
    from .. import api
    from ..io.generate import generate
    from ..verify import verify

    n = _positive(args.size, "--size")
    w = DTYPES[args.dtype]
    name = backend_name(args.backend)
    with _workdir(args.dir) as d:
        a, b, c = (f"{d / 'bench.h5'}:/{x}" for x in "ABC")
        for spec, seed in ((a, 1), (b, 2)):
            generate(spec, (n, n), dtype=args.dtype, seed=seed, overwrite=True)
        memory = parse_size(args.memory, name="--memory") or max(2 * w * n * n // 4, 1 << 20)
        out, stats = api.matmul(a, b, c, memory=memory, backend=name, overwrite=True,
                                stats=True, kernel=args.kernel, precision=args.precision)
        check = verify(a, b, c, precision=args.precision)
        t_core = in_core_seconds(a, b, name, args.kernel, args.precision)
    flops = 2.0 * n ** 3
    result = {"n": n, "dtype": args.dtype, "memory": int(memory), "backend": name,
              "kernel": args.kernel, "precision": args.precision,
              "verified": check.passed, "bigmm_seconds": stats.seconds,
              "bigmm_tflops": flops / stats.seconds / 1e12, "in_core_seconds": t_core,
              "in_core_tflops": flops / t_core / 1e12, "ratio_to_in_core": t_core / stats.seconds}
    if args.json:
        _answer(args, check, result)
    else:
        arith = f", precision {args.precision}" if args.precision else ""
        print(f"n={n} {args.dtype}, budget {format_bytes(memory)}, backend {name}{arith}, "
              f"product {'verified' if check.passed else 'WRONG'}")
        print(f"bigmm out of core (HDF5 to HDF5): {format_seconds(stats.seconds)}, "
              f"{result['bigmm_tflops']:.3f} TFLOP/s")
        print(f"in-core gemm, same backend:       {format_seconds(t_core)}, "
              f"{result['in_core_tflops']:.3f} TFLOP/s (operands already in its memory)")
        print(f"bigmm / in-core throughput: {result['ratio_to_in_core']:.2f}")
    return 0 if check.passed else EXIT_FAIL


def in_core_seconds(a: str, b: str, backend: str, kernel: str | None = None,
                    precision: str | None = None) -> float:
    """Seconds of one gemm of the whole operands in the backend's memory (after a warm-up),
    with the same kernel and precision."""
    from ..io import open_input
    from ..job import resolve_backend
    from ..units import accumulate_dtype, dtype_name, numpy_dtype

    be = resolve_backend(backend, kernel, precision)
    try:
        views = []
        for spec in (a, b, None):
            src = open_input(spec) if spec else None
            shape = src.shape if src else (views[0][1].shape[0], views[1][1].shape[1])
            dtype = src.dtype if src else numpy_dtype(  # C in the dtype the products sum in
                accumulate_dtype(dtype_name(views[0][1].dtype)))
            host = be.view(be.host_buffer(shape[0] * shape[1], dtype), shape)
            dev = be.view(be.device_buffer(shape[0] * shape[1], dtype), shape)
            if src:
                src.read(0, shape[0], 0, shape[1], host)
                src.close()
            views.append((host, dev))
        stream = be.stream()
        for host, dev in views[:2]:
            be.copy_in(host, dev, stream)
        (_, da), (_, db), (_, dc) = views
        be.gemm(da, db, dc, 1.0, 0.0, False, False, stream)  # warm-up (and kernel compile)
        be.synchronize(be.record(stream))
        t0 = time.perf_counter()
        be.gemm(da, db, dc, 1.0, 0.0, False, False, stream)
        be.synchronize(be.record(stream))
        return time.perf_counter() - t0
    finally:
        be.close()


def _positive(v: int, name: str) -> int:
    if v < 1:
        raise OptionError(f"Expected {name} to be a positive integer. Got {v}.")
    return v


class _workdir:
    """The given directory (created, kept) or a temporary one (removed)."""

    def __init__(self, path):
        self.path = path
        self._tmp = None

    def __enter__(self) -> Path:
        if self.path is not None:
            p = Path(self.path)
            try:
                p.mkdir(parents=True, exist_ok=True)
            except OSError as exc:  # a file there, a place nobody may write
                raise OutputNotWritable(f"Expected a directory to work in at '{p}'. Got "
                                        f"{exc.strerror or exc}.") from None
            return p
        self._tmp = tempfile.TemporaryDirectory(prefix="bigmm-")
        return Path(self._tmp.name)

    def __exit__(self, *exc):
        if self._tmp is not None:
            self._tmp.cleanup()
        return False
