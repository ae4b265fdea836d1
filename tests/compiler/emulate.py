"""Run a generated *elementwise* CUDA kernel on the CPU, thread by thread, for tests.

An elementwise kernel has no barriers, shuffles or shared memory: every thread's work
depends only on its block and thread index, so running the threads one after another
computes what the GPU computes. The source is compiled as C++ with ``g++`` (the CUDA
keywords defined away, ``threadIdx``/``blockIdx``/``blockDim``/``gridDim`` as globals the
driver sets, the float16 conversions' PTX replaced by ``_Float16`` casts, which round to
nearest even like ``cvt.rn``), loaded with ctypes, and each (block, thread) of a launch is
called in turn. This checks the generated index arithmetic — views read in place,
pieces of a concatenation, several outputs, vectorised entries and grid-stride loops —
where no GPU is available; it says nothing about speed, and the CPU's ``libm`` differs
from CUDA's by an ulp or so in transcendental functions.
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from pyc_lab.compiler.codegen.cuda_types import KernelSource

__all__ = ["emulate", "needs_gxx"]

#: Tests that emulate kernels skip, with the reason, where there is no C++ compiler.
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None,
                               reason="needs g++ to run generated kernels on the CPU")

_PRELUDE = r"""
#include <cmath>
#include <math.h>
#include <cstring>
#include <cstdint>
struct pyc_dim3 { unsigned int x, y, z; };
static pyc_dim3 threadIdx, blockIdx, blockDim, gridDim;
extern "C" void pyc_set(unsigned int b, unsigned int t, unsigned int bd, unsigned int gd) {
    blockIdx.x = b; threadIdx.x = t; blockDim.x = bd; gridDim.x = gd;
    blockIdx.y = blockIdx.z = threadIdx.y = threadIdx.z = 0;
    blockDim.y = blockDim.z = gridDim.y = gridDim.z = 1;
}
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline double __longlong_as_double(long long i) {
    double d; std::memcpy(&d, &i, 8); return d;
}
static inline float __uint_as_float(unsigned int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline unsigned int __float_as_uint(float f) {
    unsigned int i; std::memcpy(&i, &f, 4); return i;
}
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
"""

_PTX = {
    'asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));':
        "{ _Float16 v; std::memcpy(&v, &h, 2); f = static_cast<float>(v); }",
    'asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));':
        "{ _Float16 v = static_cast<_Float16>(f); std::memcpy(&h, &v, 2); }",
    'asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(d));':
        "{ _Float16 v = static_cast<_Float16>(d); std::memcpy(&h, &v, 2); }",
}

_BUILT: dict[str, ctypes.CDLL] = {}


def _library(src: KernelSource) -> ctypes.CDLL:
    text = src.source
    for ptx, cpu in _PTX.items():
        text = text.replace(ptx, cpu)
    if "asm(" in text:
        raise ValueError(f"{src.name} has inline PTX the emulator does not know")
    text = _PRELUDE + text
    key = hashlib.sha1(text.encode()).hexdigest()[:16]
    if key not in _BUILT:
        work = Path(tempfile.mkdtemp(prefix="pyc-emulate-"))
        cpp, lib = work / f"{src.name}.cpp", work / f"{src.name}.so"
        cpp.write_text(text)
        res = subprocess.run(["g++", "-O1", "-std=c++17", "-shared", "-fPIC", "-w",
                              str(cpp), "-o", str(lib)], capture_output=True, text=True,
                             timeout=300, check=False)
        assert res.returncode == 0, f"g++ failed on {src.name}:\n{res.stderr}\n{text}"
        _BUILT[key] = ctypes.CDLL(str(lib))
    return _BUILT[key]


def emulate(src: KernelSource, entry: str, arrays: list[np.ndarray],
            grid: int | None = None) -> None:
    """Launch ``entry`` of ``src`` on ``arrays`` (its parameters in order: inputs, then
    outputs, written in place) with ``src.launch["block"]`` threads a block and ``grid``
    blocks (default: as the launcher computes it, one thread per element or vector)."""
    lib = _library(src)
    block = src.launch["block"]
    if grid is None:
        count = src.launch["n_vec"] if entry.endswith("_vec") else src.launch["n"]
        grid = max(1, -(-count // block))
    kernel = getattr(lib, entry)
    kernel.restype = None
    pointers = [ctypes.c_void_p(a.__array_interface__["data"][0]) for a in arrays]
    for b in range(grid):
        for t in range(block):
            lib.pyc_set(b, t, block, grid)
            kernel(*pointers)
