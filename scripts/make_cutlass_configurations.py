"""Write the CUTLASS GEMM configurations that pyc_lab ships, from cutlass_cppgen.

    python scripts/make_cutlass_configurations.py

Enumerates ``tile_descriptions()`` for every dtype and layout pyc_lab builds, on sm_90
(needs nvidia-cutlass and nvcc, not a GPU) and writes
``pyc_lab/data/cutlass/configurations.json``, which
:func:`pyc_lab.kernels.cutlass.configurations` reads where ``cutlass_cppgen`` cannot be
imported (a machine set up for notebooks only: replays and the configuration space need
no CUDA toolkit). A test checks that the shipped file is what this script writes.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version

from pyc_lab.kernels.cutlass.config import DTYPES, LAYOUTS, live_configurations
from pyc_lab.paths import data_path

CCS = (90,)


def build() -> dict:
    """The file's content: configurations per ``<dtype>/<layout>/sm_<cc>``, sorted by id."""
    table = {}
    for cc in CCS:
        for dtype in DTYPES:
            for layout in LAYOUTS:
                configs = sorted(live_configurations(dtype, layout, cc), key=lambda c: c.id)
                table[f"{dtype}/{layout}/sm_{cc}"] = [c.to_dict() for c in configs]
    return {"format": "pyc_lab.cutlass_configurations", "nvidia_cutlass": version("nvidia-cutlass"),
            "configurations": table}


if __name__ == "__main__":
    path = data_path("cutlass", "configurations.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(build(), sort_keys=True, separators=(",", ":")) + "\n")
    print(f"wrote {path}", file=sys.stderr)
