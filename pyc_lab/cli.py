"""The ``pyc-lab`` command for headless use (clusters, CI, scripts).

    pyc-lab hw                      topology table of this machine
    pyc-lab hw --bandwidth          ... plus measured copy bandwidths
    pyc-lab hw --snapshot dgx-h100  a shipped or saved profile instead
    pyc-lab hw --save hw.json       record this machine's profile as a snapshot
    pyc-lab hw --json               the profile as JSON on stdout
    pyc-lab tune gemm M N K         tune a CUTLASS GEMM on this GPU, compare with cuBLAS
    pyc-lab tune gemm M N K --replay [PATH]
                                    replay a tuning recorded on a GPU (the shipped H200
                                    recording, or a tuning-database export): no GPU needed
    pyc-lab tune gemm ... --json    the result as JSON on stdout
    pyc-lab tune gemm M N K --bias --activation gelu
                                    tune kernels with a fused bias + GELU epilogue
    pyc-lab tune many FILE|--problems "MxNxK,..." [--dtype] [--budget S] [--replay [PATH]]
                                    tune a list of problems, builds shared, one total
                                    budget; a summary table per problem
    pyc-lab cache export FILE       the kernel cache as one .tar.gz (cache import FILE:
                                    add one, each entry verified by hash)
    pyc-lab db export FILE          the tuning database as JSON or CSV (db import FILE:
                                    merge one) — with the cache, a tuned set moves
                                    between machines
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import PycLabError
from .units import gemm_flops, tflops

if TYPE_CHECKING:  # pragma: no cover
    from .kernels.tuning.autotune import TuneResult
    from .kernels.tuning.keys import Measurement

__all__ = ["byte_sizes", "check_recording", "dimension", "main"]


def dimension(text: str) -> int:
    """An argparse type: a problem dimension (M, N or K), a positive whole number."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive dimension; give a "
                                         "whole number >= 1")
    return value


def byte_sizes(text: str) -> list[int]:
    """An argparse type: comma-separated copy sizes in bytes (``4096,1048576``)."""
    sizes = []
    for part in text.split(","):
        try:
            value = int(part.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{part.strip()!r} is not a number of bytes; give whole numbers separated by "
                "commas, e.g. --sizes 4096,1048576") from None
        if value < 1:
            raise argparse.ArgumentTypeError(
                f"{value} is not a positive number of bytes; e.g. --sizes 4096,1048576")
        sizes.append(value)
    return sizes


def check_recording(path: str, flag: str = "--replay") -> None:
    """Refuse a ``--replay PATH`` that cannot be a recording, naming the file.

    Raises
    ------
    PycLabError
        If ``path`` is not a file, or not a ``.json``/``.csv`` tuning-database export.
    """
    file = Path(path)
    alone = f"or {flag} alone for the H200 recording shipped with pyc_lab"
    if not file.is_file():
        what = "a folder, not a file" if file.is_dir() else "no such file"
        raise PycLabError(f"{flag} {path}: {what}; give a tuning-database export (a .json "
                          f"or .csv file written by `pyc-lab db export FILE`), {alone}")
    if file.suffix.lower() not in (".json", ".csv"):
        raise PycLabError(f"{flag} {path}: a recording is a tuning-database export, a .json "
                          f"or .csv file (`pyc-lab db export FILE`), {alone}")


def _parser() -> argparse.ArgumentParser:
    from .kernels.tuning.options import GemmTuneOptions

    defaults = GemmTuneOptions()
    parser = argparse.ArgumentParser(prog="pyc-lab", description=__doc__.split("\n\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="command", required=True)
    hw = sub.add_parser("hw", help="show the hardware topology and (optionally) bandwidths")
    hw.add_argument("--snapshot", "-s", metavar="PATH",
                    help="a saved profile: JSON path or shipped name (h200, dgx-h100)")
    hw.add_argument("--bandwidth", "-b", action="store_true",
                    help="measure H2D/D2H (pageable, pinned), D2D and peer copies")
    hw.add_argument("--sizes", metavar="BYTES", type=byte_sizes,
                    help="comma-separated copy sizes in bytes for --bandwidth "
                         "(e.g. 4096,1048576)")
    hw.add_argument("--save", metavar="PATH", help="write the profile as a JSON snapshot")
    hw.add_argument("--bandwidth-csv", metavar="PATH", help="write the bandwidth table as CSV")
    hw.add_argument("--json", action="store_true", help="print the profile as JSON")

    tune = sub.add_parser("tune", help="autotune a kernel on this GPU (or replay a recording)")
    ops = tune.add_subparsers(dest="op", required=True)
    gemm = ops.add_parser("gemm", help="tune a CUTLASS GEMM (a is M x K, b is K x N)",
                          description="Tune a CUTLASS GEMM live on this GPU, or replay the "
                                      "tuning recorded on a GPU with --replay.")
    for dim in ("M", "N", "K"):
        gemm.add_argument(dim.lower(), metavar=dim, type=dimension, help=f"the problem's {dim}")
    gemm.add_argument("--dtype", default=defaults.dtype,
                      help=f"f16, bf16, tf32 or f32 (SIMT); default {defaults.dtype}")
    gemm.add_argument("--layout", default=defaults.layout,
                      help=f"tn, tt, nt or nn (default: {defaults.layout})")
    gemm.add_argument("--strategy", default=defaults.strategy,
                      help="exhaustive, random, successive_halving or evolutionary "
                           f"(default: {defaults.strategy})")
    gemm.add_argument("--budget", metavar="S", type=float, default=defaults.budget_s or 0.0,
                      help="stop starting candidates after S seconds (0: no limit; "
                           f"default {defaults.budget_s or 0:g})")
    gemm.add_argument("--max-candidates", metavar="N", type=int,
                      default=defaults.max_candidates or 0,
                      help="consider at most N configurations (0: all; default "
                           f"{defaults.max_candidates or 0})")
    gemm.add_argument("--replay", metavar="PATH", nargs="?", const="", default=None,
                      help="replay a recorded tuning instead of tuning live: the H200 "
                           "recording shipped with pyc_lab, or a tuning-database export")
    gemm.add_argument("--seed", type=int, default=defaults.seed,
                      help="the search's random seed")
    gemm.add_argument("--json", action="store_true", help="print the result as JSON")
    gemm.add_argument("--bias", action="store_true",
                      help="tune kernels that add a bias row inside the epilogue (live only)")
    gemm.add_argument("--activation", choices=["relu", "gelu", "silu"],
                      help="tune kernels with this activation in the epilogue (live only)")
    many = ops.add_parser("many", help="tune a list of GEMM problems with one total budget",
                          description="Tune many GEMM problems (builds shared and parallel, "
                                      "one total budget) live on this GPU, or replay them "
                                      "from a recording with --replay.")
    many.add_argument("file", metavar="FILE", nargs="?",
                      help="problems: JSON list, or one 'MxNxK [dtype [layout]]' a line")
    many.add_argument("--problems", metavar="MxNxK,...",
                      help="comma-separated problems instead of a file")
    many.add_argument("--dtype", default=defaults.dtype,
                      help=f"dtype of problems that do not say (default {defaults.dtype})")
    many.add_argument("--layout", default=defaults.layout,
                      help=f"layout of problems that do not say (default {defaults.layout})")
    many.add_argument("--budget", metavar="S", type=float, default=0.0,
                      help="total seconds for all problems (0: 60 per problem)")
    many.add_argument("--max-candidates", metavar="N", type=int,
                      default=defaults.max_candidates or 0,
                      help=f"per problem (0: all; default {defaults.max_candidates or 0})")
    many.add_argument("--workers", metavar="N", type=int, help="parallel nvcc builds")
    many.add_argument("--replay", metavar="PATH", nargs="?", const="", default=None,
                      help="replay a recording instead of tuning live (no GPU needed)")
    many.add_argument("--json", action="store_true", help="print the summary as JSON")
    for cmd in (gemm, many):
        cmd.add_argument("--no-cutlass", dest="cutlass", action="store_false",
                         help="measure no CUTLASS candidates (no nvcc builds): only the "
                              "skinny GEMM and cuBLASLt's picks beside the libraries "
                              "(live only)")
        cmd.add_argument("--no-skinny", dest="skinny", action="store_false",
                         help="leave out pyc_lab's skinny GEMM for M <= 64 (live only)")
        cmd.add_argument("--no-lt-search", dest="lt_search", action="store_false",
                         help="leave out cuBLASLt's heuristic picks beyond its first "
                              "(live only)")
    for name, what, suffix in (("cache", "the CUTLASS kernel cache", ".tar.gz"),
                               ("db", "the tuning database", ".json or .csv")):
        cmd = sub.add_parser(name, help=f"export or import {what}")
        cmd.add_argument("action", choices=["export", "import"])
        cmd.add_argument("path", metavar="FILE", help=f"the file ({suffix})")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "tune":
            return _tune_many(args) if args.op == "many" else _tune_gemm(args)
        if args.command in ("cache", "db"):
            return _move(args)
        return _hw(args)
    except PycLabError as exc:
        print(f"pyc-lab: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pyc-lab: interrupted", file=sys.stderr)
        return 130


def _one_line(exc: BaseException) -> str:
    """An error's message on one line (a compiler's or a file's text may hold several)."""
    return "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())


def _move(args: argparse.Namespace) -> int:
    """``pyc-lab cache|db export|import FILE``."""
    if args.action == "import" and not Path(args.path).is_file():
        what = "a folder, not a file" if Path(args.path).is_dir() else "no such file"
        raise PycLabError(f"{args.command} import {args.path}: {what}; give a file written "
                          f"by `pyc-lab {args.command} export FILE`")
    if args.command == "cache":
        from .kernels.cache import KernelCache

        store: object = KernelCache()
        what = "kernel-cache entries"
    else:
        from .kernels.tuning.database import TuningDB

        store = TuningDB()
        what = "tuning-database rows"
    n = store.export(args.path) if args.action == "export" else store.import_(args.path)
    where = getattr(store, "root", None) or getattr(store, "path", "")
    verb = "exported from" if args.action == "export" else "imported into"
    print(f"{n} {what} {verb} {where} ({args.path})")
    return 0


def _hw(args: argparse.Namespace) -> int:
    from .hardware import detect_hardware
    from .profiling import probe_bandwidth
    from .profiling.bandwidth import bandwidth_summary

    # every argument is checked before anything is printed or measured
    for flag, given in (("--sizes", args.sizes), ("--bandwidth-csv", args.bandwidth_csv)):
        if given is not None and not args.bandwidth:
            raise PycLabError(f"{flag} applies to the bandwidth measurement; add --bandwidth")
    if args.bandwidth and args.snapshot:
        raise PycLabError("--bandwidth measures this machine; drop --snapshot to use it")
    if args.bandwidth and args.bandwidth_csv:
        folder = Path(args.bandwidth_csv).parent
        if not folder.is_dir():  # before measuring for seconds, not after
            raise PycLabError(f"--bandwidth-csv {args.bandwidth_csv}: folder {folder} does "
                              "not exist; create it first")
    profile = detect_hardware(snapshot=args.snapshot)
    if args.save:
        profile.to_json(args.save)
    if args.json:
        print(json.dumps(profile.to_dict(), indent=2))
        return 0
    print(profile.to_text())
    if args.bandwidth:
        try:
            frame = probe_bandwidth(profile=profile, sizes=args.sizes)
        except MemoryError:
            raise PycLabError(f"--sizes {max(args.sizes or [0])}: not enough memory for copies "
                              "that large; give smaller sizes") from None
        if args.bandwidth_csv:
            try:
                frame.to_csv(args.bandwidth_csv, index=False)
            except OSError as exc:
                raise PycLabError(f"--bandwidth-csv {args.bandwidth_csv}: cannot write it "
                                  f"({exc})") from None
        print()
        print(f"Copy bandwidth — {frame.attrs.get('device', '')}")
        cols = ["kind", "peer", "size", "repeats", "median_ms", "gbps", "theoretical_gbps",
                "pct_of_theoretical"]
        ok = frame[frame["status"] == "ok"]
        if len(ok):
            print(ok[cols].to_string(index=False))
        print()
        print(bandwidth_summary(frame).to_string(index=False))
    return 0


def _tune_gemm(args: argparse.Namespace) -> int:
    budget = None if args.budget == 0 else args.budget
    max_candidates = None if args.max_candidates == 0 else args.max_candidates
    if budget is not None and budget < 0:
        raise PycLabError(f"--budget {args.budget:g}: give seconds >= 0 (0: no limit)")
    if max_candidates is not None and max_candidates < 0:
        raise PycLabError(f"--max-candidates {args.max_candidates}: give a number >= 0 "
                          "(0: all)")
    shape = f"{args.m}x{args.n}x{args.k}"
    problem = f"GEMM {shape} {args.dtype} {args.layout}"
    replay = args.replay is not None
    quiet = args.json
    count = [0]

    def progress(row: dict) -> None:
        count[0] += 1
        ms = f"{row['ms']:.4f} ms, {row['tflops']:.1f} TFLOP/s" if row.get("ms") else \
            (row.get("message") or "").splitlines()[0][:100] if row.get("message") else ""
        where = "recorded" if replay else f"{row.get('built')}/{row.get('total')} built"
        print(f"  [{count[0]}] {row['config']}: {row['status']} {ms} ({where})", flush=True)

    from .kernels.tuning.options import GemmTuneOptions

    options = GemmTuneOptions(dtype=args.dtype, layout=args.layout, strategy=args.strategy,
                              budget_s=budget, max_candidates=max_candidates, seed=args.seed,
                              bias=args.bias, activation=args.activation,
                              cutlass=args.cutlass, skinny=args.skinny,
                           lt_search=args.lt_search)
    observer = None if quiet else progress
    if replay and options.epilogue.fused:
        raise PycLabError("--replay replays plain GEMMs only; --bias/--activation tune "
                          "fused epilogues live on a GPU")
    if args.replay:
        check_recording(args.replay)
    if replay:
        from .kernels.tuning.autotune import replay_autotune
        from .kernels.tuning.recording import recorded_result

        source = args.replay or None
        info = recorded_result(args.m, args.n, args.k, dtype=args.dtype, layout=args.layout,
                               source=source).replay
        if not quiet:
            print(f"Replaying the tuning of {problem} {info.label}: no kernel is built or "
                  f"run here ({info.source_label}; driver {info.driver}, CUDA {info.cuda})")
            print(f"strategy {args.strategy}, budget {_limit(budget, ' s')}, at most "
                  f"{_limit(max_candidates, ' candidates')}")
        result = replay_autotune(args.m, args.n, args.k, options=options, source=source,
                                 observer=observer)
    else:
        from .hardware.device import cupy_status

        cp, why = cupy_status()
        if cp is None:
            raise PycLabError(
                f"live tuning builds and times kernels on a GPU and needs a CUDA device: {why}. "
                "Add --replay to replay the tuning recorded on an H200 instead: "
                f"pyc-lab tune gemm {args.m} {args.n} {args.k} --dtype {args.dtype} --replay")
        from .kernels.tuning.autotune import autotune_gemm

        if not quiet:
            print(f"Tuning {problem} on this GPU: strategy {args.strategy}, budget "
                  f"{_limit(budget, ' s')}, at most {_limit(max_candidates, ' candidates')}",
                  flush=True)
        result = autotune_gemm(args.m, args.n, args.k, options=options, observer=observer)
    if quiet:
        print(json.dumps(_result_json(result), indent=2))
        return 0
    label = "recorded " if replay else ""
    if result.best is not None:
        ms = result.best.time_ms
        rate = tflops(gemm_flops(args.m, args.n, args.k), ms)
        print(f"best: {_config_name(result.best)}, {label}{ms:.4f} ms = {rate:.1f} TFLOP/s")
    else:
        print("no candidate ran correctly")
    print(f"{result.table.shape[0]} candidate(s) evaluated; stopped by {result.stopped_by}")
    print()
    print(result.compare().round({"ms": 4, "tflops": 1, "pct_of_peak": 1, "vs_cublas": 3})
          .to_string(index=False))
    return 0


def _tune_many(args: argparse.Namespace) -> int:
    """``pyc-lab tune many``: parse, call :func:`autotune_many`, print its summary."""
    from .kernels.tuning.many import autotune_many, parse_problems, read_problems

    if (args.file is None) == (args.problems is None):
        raise PycLabError("tune many: give a FILE or --problems \"MxNxK,...\" (one of them)")
    if args.budget < 0 or args.max_candidates < 0:
        raise PycLabError("tune many: --budget and --max-candidates take numbers >= 0")
    problems = (read_problems(args.file, args.dtype, args.layout) if args.file
                else parse_problems(args.problems.split(","), args.dtype, args.layout))
    replay = args.replay is not None
    if args.replay:
        check_recording(args.replay)
    if not replay:
        from .hardware.device import cupy_status

        cp, why = cupy_status()
        if cp is None:
            raise PycLabError(f"live tuning needs a CUDA device: {why}. Add --replay to "
                              "replay the tuning recorded on an H200 instead")
    result = autotune_many(problems, budget_s=args.budget or None, workers=args.workers,
                           replay=replay, source=args.replay or None,
                           max_candidates=args.max_candidates or None,
                           cutlass=args.cutlass, skinny=args.skinny,
                           lt_search=args.lt_search)
    summary = result.summary
    if args.json:
        print(summary.to_json(orient="records", indent=2))
        return 0
    mode = "replayed from a recording" if replay else "tuned on this GPU"
    print(f"{len(problems)} problem(s) {mode}; budget {result.budget_s:g} s, used "
          f"{result.total_seconds:.1f} s")
    cols = ["problem", "winner", "winner_ms", "best_library", "speedup", "candidates",
            "seconds", "status"]
    print(summary[cols].to_string(index=False))
    return 0


def _limit(value: float | None, unit: str) -> str:
    return "none" if value is None else f"{value:g}{unit}"


def _config_name(m: Measurement) -> str:
    from .kernels.tuning.result import config_name

    return config_name(m.config, m.config_id)


def _result_json(res: TuneResult) -> dict:
    """A TuneResult (live or replayed) as JSON-able data."""
    import dataclasses

    info = getattr(res, "replay", None)
    best = res.best
    return {
        "problem": dataclasses.asdict(res.problem),
        "device": dataclasses.asdict(res.device),
        "mode": "replay" if info is not None else "live",
        "replay": None if info is None else {**dataclasses.asdict(info), "label": info.label,
                                             "run_ids": list(info.run_ids)},
        "strategy": res.strategy,
        "stopped_by": res.stopped_by,
        "best": None if best is None else {"config": _config_name(best),
                                           "config_dict": best.config, "ms": best.time_ms,
                                           "tflops": best.tflops},
        "baselines": dict(res.baselines),
        "compare": json.loads(res.compare().to_json(orient="records")),
        "candidates": json.loads(res.table.to_json(orient="records")),
    }


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
