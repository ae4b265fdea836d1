"""Check a GPU lane's tuning export and copy it over the recording pyc_lab ships.

    python scripts/refresh_recording.py benchmarks/results/h200/tuning-replay.json [DEST]

Run from a source checkout after the GPU lane's GEMM benchmark has written the export;
then re-execute ``notebooks/03_autotune_gemm.ipynb`` (``scripts/run-notebooks``): its
replay outputs come from the recording. Nothing is copied when the export is missing,
unreadable or holds no GEMM problem (exit status 1, with the reason).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from pyc_lab.errors import PycLabError
from pyc_lab.kernels.tuning.recording import RECORDING, recorded_problems, recording_path
from pyc_lab.paths import data_path


def refresh(src: str | Path, dest: str | Path | None = None) -> int:
    """Copy ``src`` to ``dest`` (default: the shipped recording); the problem count."""
    problems = recorded_problems(src)
    if problems.empty:
        raise PycLabError(f"{src} holds no GEMM tuning rows; not copying it")
    target = Path(dest) if dest is not None else data_path("tuning", RECORDING)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(recording_path(src), target)
    print(problems.to_string(index=False))
    print(f"copied {src} to {target} ({len(problems)} problems)")
    return len(problems)


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    try:
        refresh(*sys.argv[1:])
    except PycLabError as exc:
        sys.exit(f"refresh_recording: {exc}")
