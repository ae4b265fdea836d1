"""Run a generated CUDA kernel on the CPU, for tests.

An elementwise kernel has no barriers, shuffles or shared memory: every thread's work
depends only on its block and thread index, so running the threads one after another
computes what the GPU computes (:func:`emulate`). Row and column kernels synchronise:
:func:`emulate_threads` runs the threads of each block as real threads, with
``__syncthreads()`` as a block barrier, ``__shfl_xor_sync`` as an exchange through
memory between two barriers of the warp, and ``__shared__`` arrays as function statics
(blocks run one after another, so one block's threads share them).

The source is compiled as C++ with ``g++`` (the CUDA keywords defined away, the thread
and block indices as globals the driver sets, the float16 conversions' PTX replaced by
``_Float16`` casts, which round to nearest even like ``cvt.rn``) and loaded with ctypes.
This checks the generated index arithmetic, reductions and roundings — views read in
place, pieces of a concatenation, several outputs, vectorised entries, grid-stride
loops, warp and block reductions, split column sums — where no GPU is available; it
says nothing about speed, and the CPU's ``libm`` differs from CUDA's by an ulp or so in
transcendental functions.
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

__all__ = ["emulate", "emulate_threads", "native_library", "needs_gxx"]

#: Tests that emulate kernels skip, with the reason, where there is no C++ compiler.
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None,
                               reason="needs g++ to run generated kernels on the CPU")

#: CUDA's bit-cast intrinsics and keywords, as C++ (shared by both preludes).
_INTRINSICS = r"""
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline double __longlong_as_double(long long i) {
    double d; std::memcpy(&d, &i, 8); return d;
}
static inline float __uint_as_float(unsigned int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline unsigned int __float_as_uint(float f) {
    unsigned int i; std::memcpy(&i, &f, 4); return i;
}
static inline float pyc_cpu_expf(float x) { return __builtin_expf(x); }
#define __expf pyc_cpu_expf
static inline float pyc_cpu_rcp(float b) {
    const float r = 1.0f / b;
#ifdef PYC_RCP_TOWARD
    return std::isfinite(r) && r != 0.0f ? std::nextafter(r, PYC_RCP_TOWARD) : r;
#else
    return r;
#endif
}
"""
_KEYWORDS = r"""
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
"""

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
""" + _INTRINSICS + _KEYWORDS

_PTX = {
    'asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));':
        "{ _Float16 v; std::memcpy(&v, &h, 2); f = static_cast<float>(v); }",
    'asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));':
        "{ _Float16 v = static_cast<_Float16>(f); std::memcpy(&h, &v, 2); }",
    'asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(d));':
        "{ _Float16 v = static_cast<_Float16>(d); std::memcpy(&h, &v, 2); }",
    # sm_80's bfloat16 rounding (native/bf16.cuh): the bit arithmetic it stands for
    'asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));':
        "h = pyc_float_to_bf16_bits(f);",
    # sm_80's packed bfloat16 rounding (native/bf16.cuh): the rounded bits, upper half
    'asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(u) : "f"(f), "f"(0.0f));':
        "u = static_cast<unsigned int>(pyc_float_to_bf16_bits(f)) << 16;",
    # the approximate reciprocal (native/f16.cuh's division): 1/b rounded, then moved one
    # float32 ulp toward PYC_RCP_TOWARD (a -D flag; default: not moved) to stand for the
    # hardware's error (CUDA documents rcp.approx as within one ulp)
    'asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(b));':
        "r = pyc_cpu_rcp(b);",
    # sm_80's NaN-propagating float max/min (native/reduce.cuh; compiled for sm_80+ only)
    'asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));':
        "r = a != a ? a : (b != b ? b : (a > b ? a : b));",
    'asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));':
        "r = a != a ? a : (b != b ? b : (a < b ? a : b));",
}

_BUILT: dict[str, ctypes.CDLL] = {}


def _cpu_text(text: str, name: str) -> str:
    """``text`` with the float16 PTX replaced (any other inline PTX refused)."""
    for ptx, cpu in _PTX.items():
        text = text.replace(ptx, cpu)
    if "asm(" in text:
        raise ValueError(f"{name} has inline PTX the emulator does not know")
    return text


def _cpu_source(src: KernelSource) -> str:
    """``src``'s text with the float16 PTX replaced (any other inline PTX refused)."""
    return _cpu_text(src.source, src.name)


def native_library(text: str, name: str) -> ctypes.CDLL:
    """CUDA C++ ``text`` — sources of ``native/`` followed by a C++ driver that runs a
    kernel's blocks with ``pyc_grid(gx, gy, threads, body)`` (each block's threads as
    real threads, ``__syncthreads()`` a barrier, ``__shared__`` arrays shared by the
    block's threads) — compiled for the CPU as the generated row kernels are."""
    return _build(_THREADED + _cpu_text(text, name), name, ["-std=c++20", "-pthread"])


def _build(text: str, name: str, flags: list[str]) -> ctypes.CDLL:
    """``text`` compiled by g++ into a loaded shared library (cached by its text)."""
    key = hashlib.sha1(text.encode()).hexdigest()[:16]
    if key not in _BUILT:
        work = Path(tempfile.mkdtemp(prefix="pyc-emulate-"))
        cpp, lib = work / f"{name}.cpp", work / f"{name}.so"
        cpp.write_text(text)
        res = subprocess.run(["g++", "-O1", *flags, "-shared", "-fPIC", "-w", str(cpp), "-o",
                              str(lib)], capture_output=True, text=True, timeout=300,
                             check=False)
        assert res.returncode == 0, f"g++ failed on {name}:\n{res.stderr}\n{text}"
        _BUILT[key] = ctypes.CDLL(str(lib))
    return _BUILT[key]


def _library(src: KernelSource, defines: str = "") -> ctypes.CDLL:
    return _build(defines + _PRELUDE + _cpu_source(src), src.name, ["-std=c++17"])


def emulate(src: KernelSource, entry: str, arrays: list[np.ndarray],
            grid: int | None = None, block: int | None = None, defines: str = "") -> None:
    """Launch ``entry`` of ``src`` on ``arrays`` (its parameters in order: inputs, then
    outputs, written in place) with ``block`` threads a block (default
    ``src.launch["block"]``) and ``grid`` blocks (default: as the launcher computes it,
    one thread per element or vector). ``defines`` is C text put before everything (for
    instance ``#define PYC_RCP_TOWARD 0.0f``)."""
    lib = _library(src, defines)
    block = src.launch["block"] if block is None else block
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


_THREADED = r"""
#include <cmath>
#include <math.h>
#include <cstring>
#include <cstdint>
#include <barrier>
#include <thread>
#include <vector>
struct pyc_dim3 { unsigned int x, y, z; };
static thread_local pyc_dim3 threadIdx, blockIdx;
static pyc_dim3 blockDim, gridDim;
static std::barrier<>* pyc_block_barrier = nullptr;
static std::vector<std::barrier<>*> pyc_warp_barriers;
static unsigned long long pyc_exchange[1024];
""" + _INTRINSICS + _KEYWORDS + r"""
static inline void __syncthreads() { pyc_block_barrier->arrive_and_wait(); }
// blocks run one after another, so a block's memory is every later block's to read:
// device-wide fences are no-ops, an atomic add (one thread's) a plain one
static inline void __threadfence() {}
template <typename T>
static inline T atomicAdd(T* p, T v) { const T old = *p; *p = old + v; return old; }
template <typename T>
static inline T __ldcg(const T* p) { return *p; }
template <typename T>
static inline T __shfl_xor_sync(unsigned int, T v, int offset, int = 32) {
    const unsigned int t = threadIdx.x;
    std::memcpy(&pyc_exchange[t], &v, sizeof(T));
    pyc_warp_barriers[t / 32]->arrive_and_wait();
    T r;
    std::memcpy(&r, &pyc_exchange[t ^ static_cast<unsigned int>(offset)], sizeof(T));
    pyc_warp_barriers[t / 32]->arrive_and_wait();
    return r;
}
#define __shared__ static
template <typename F>
static void pyc_grid(unsigned int gx, unsigned int gy, unsigned int block, F body,
                     unsigned int gz = 1) {
    blockDim = {block, 1, 1};
    gridDim = {gx, gy, gz};
    std::barrier<> bar(block);
    pyc_block_barrier = &bar;
    std::vector<std::barrier<>*> warps;
    for (unsigned int w = 0; w < (block + 31) / 32; ++w) {
        warps.push_back(new std::barrier<>(block - w * 32 < 32 ? block - w * 32 : 32));
    }
    pyc_warp_barriers = warps;
    for (unsigned int bz = 0; bz < gz; ++bz) {
    for (unsigned int by = 0; by < gy; ++by) {
        for (unsigned int bx = 0; bx < gx; ++bx) {
            std::vector<std::thread> threads;
            for (unsigned int t = 0; t < block; ++t) {
                threads.emplace_back([=]() {
                    threadIdx = {t, 0, 0};
                    blockIdx = {bx, by, bz};
                    body();
                });
            }
            for (auto& th : threads) th.join();
        }
    }
    }
    for (auto* w : warps) delete w;
}
"""


def _params(source: str, entry: str) -> list[str]:
    """The C parameter declarations of kernel ``entry``."""
    import re

    match = re.search(r"\n" + re.escape(entry) + r"\(([^)]*)\)", source)
    assert match, f"no kernel {entry}"
    return [p.strip() for p in match.group(1).split(",") if p.strip()]


def _threaded_library(src: KernelSource, entry: str) -> ctypes.CDLL:
    text = _cpu_source(src)
    casts = []
    for k, p in enumerate(_params(text, entry)):
        ctype = p.rsplit(" ", 1)[0].replace("__restrict__", "").strip()
        casts.append(f"({ctype})args[{k}]" if "*" in ctype else f"*({ctype}*)args[{k}]")
    runner = (f'extern "C" void pyc_run(void** args, unsigned int gx, unsigned int gy, '
              f'unsigned int block, unsigned int gz) {{\n    pyc_grid(gx, gy, block, [=]() {{ '
              f'{entry}({", ".join(casts)}); }}, gz);\n}}\n')
    return _build(_THREADED + text + "\n" + runner, entry, ["-std=c++20", "-pthread"])


def emulate_threads(src: KernelSource, entry: str, args: list, grid: tuple[int, ...],
                    block: int) -> None:
    """Launch ``entry`` of ``src`` with ``grid`` = (x, y[, z]) blocks of ``block`` threads.

    ``args`` are the kernel's parameters in order: NumPy arrays (passed by address),
    ``None`` (a null pointer) or ctypes scalars (``ctypes.c_longlong(...)``,
    ``ctypes.c_int(...)``)."""
    lib = _threaded_library(src, entry)
    keep = []
    slots = (ctypes.c_void_p * len(args))()
    for k, a in enumerate(args):
        if isinstance(a, np.ndarray):
            slots[k] = a.__array_interface__["data"][0]
        elif a is None:  # a null pointer
            slots[k] = None
        else:
            keep.append(a)
            slots[k] = ctypes.cast(ctypes.pointer(a), ctypes.c_void_p)
    lib.pyc_run(slots, ctypes.c_uint(grid[0]), ctypes.c_uint(grid[1]), ctypes.c_uint(block),
                ctypes.c_uint(grid[2] if len(grid) > 2 else 1))
