"""Published peak rates and SM counts of known GPUs.

A live device reports its own SM count and L2 size (device properties); what no device
reports is its dense arithmetic peak, which "% of peak" figures need, and a recording
made elsewhere has no device to ask at all. Both come from the published specifications
below, looked up by a part of the GPU's name.
"""

from __future__ import annotations

__all__ = ["DENSE_PEAK_TFLOPS", "PEAK_FRACTION", "SM_COUNTS", "known_sm_count", "peak_tflops"]

#: Dense (no sparsity) fp16/bf16 tensor-core peaks by GPU name, TFLOP/s.
DENSE_PEAK_TFLOPS = {"H200": 989.4, "H100 SXM": 989.4, "H100 80GB HBM3": 989.4,
                     "H100 PCIe": 756.5, "H100 NVL": 835.0}
#: Other dtypes' dense peaks relative to fp16 on Hopper: TF32 tensor cores run at half
#: the fp16 rate; float32 on the CUDA cores at 67 of 989 TFLOP/s (H100/H200 SXM).
PEAK_FRACTION = {"f16": 1.0, "bf16": 1.0, "tf32": 0.5, "f32": 66.9 / 989.4}
#: Streaming multiprocessors of the GPUs above.
SM_COUNTS = {"H200": 132, "H100 SXM": 132, "H100 80GB HBM3": 132, "H100 PCIe": 114,
             "H100 NVL": 132}


def _lookup(table: dict[str, float], gpu_name: str) -> float | None:
    for key, value in table.items():
        if key in gpu_name:
            return value
    return None


def peak_tflops(gpu_name: str, dtype: str = "f16") -> float | None:
    """The dense peak of a GPU (by part of its name) for ``dtype``, or ``None`` if unknown.

    Examples
    --------
    >>> peak_tflops("NVIDIA H200", "tf32")
    494.7
    """
    peak = _lookup(DENSE_PEAK_TFLOPS, gpu_name)
    return None if peak is None else peak * PEAK_FRACTION.get(dtype, 1.0)


def known_sm_count(gpu_name: str) -> int | None:
    """The SM count of a known GPU (by part of its name), or ``None``."""
    count = _lookup(SM_COUNTS, gpu_name)
    return None if count is None else int(count)
