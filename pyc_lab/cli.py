"""The ``pyc-lab`` command for headless use (clusters, CI, scripts).

    pyc-lab hw                      topology table of this machine
    pyc-lab hw --bandwidth          ... plus measured copy bandwidths
    pyc-lab hw --snapshot dgx-h100  a shipped or saved profile instead
    pyc-lab hw --save hw.json       record this machine's profile as a snapshot
    pyc-lab hw --json               the profile as JSON on stdout
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence

from .errors import PycLabError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pyc-lab", description=__doc__.split("\n\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="command", required=True)
    hw = sub.add_parser("hw", help="show the hardware topology and (optionally) bandwidths")
    hw.add_argument("--snapshot", "-s", metavar="PATH",
                    help="a saved profile: JSON path or shipped name (h200, dgx-h100)")
    hw.add_argument("--bandwidth", "-b", action="store_true",
                    help="measure H2D/D2H (pageable, pinned), D2D and peer copies")
    hw.add_argument("--sizes", metavar="BYTES", type=lambda s: [int(x) for x in s.split(",")],
                    help="comma-separated copy sizes in bytes for --bandwidth")
    hw.add_argument("--save", metavar="PATH", help="write the profile as a JSON snapshot")
    hw.add_argument("--bandwidth-csv", metavar="PATH", help="write the bandwidth table as CSV")
    hw.add_argument("--json", action="store_true", help="print the profile as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return _hw(args)
    except PycLabError as exc:
        print(f"pyc-lab: error: {exc}", file=sys.stderr)
        return 2


def _hw(args: argparse.Namespace) -> int:
    from .runtime import detect_hardware, probe_bandwidth
    from .runtime.bandwidth import bandwidth_summary

    profile = detect_hardware(snapshot=args.snapshot)
    if args.save:
        profile.to_json(args.save)
    if args.json:
        print(json.dumps(profile.to_dict(), indent=2))
        return 0
    print(profile.to_text())
    if args.bandwidth:
        if args.snapshot:
            raise PycLabError("--bandwidth measures this machine; drop --snapshot to use it")
        frame = probe_bandwidth(profile=profile, sizes=args.sizes)
        if args.bandwidth_csv:
            frame.to_csv(args.bandwidth_csv, index=False)
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


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
