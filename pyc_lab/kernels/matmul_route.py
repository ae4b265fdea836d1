"""Which implementation :func:`pyc_lab.matmul` runs: the never-slower rule, and the
library path for each dtype.

**Never slower.** The tuner times the libraries beside its candidates in the same run
and stores them as ``"baseline"`` rows (``{"baseline": "cublas"}``, ``"cublaslt"``,
``"torch"``). A tuned CUTLASS kernel runs only when its measured time beat the fastest
library path ``pl.matmul`` itself can call for that problem (cuBLAS through
``cupy.matmul``; cuBLASLt through nvmath-python when it is installed) *in that same
run*; torch's time is shown in reports but is no path of ``pl.matmul``'s. Otherwise the
library runs. When in doubt, the library:

- a tuning run that recorded no library time is no evidence: library;
- an exact match must have beaten the library by at least :data:`EXACT_MARGIN`: a
  smaller win is within the spread between runs (on the H200 a skinny GEMM 0.8 % ahead
  at tuning measured 2.9 % behind in a later sweep), and equal times go to the library;
- a **bucketed** match (the nearest tuned shape, not this one) must have beaten the
  library by at least :data:`BUCKET_MARGIN` at its own shape, and its kernel must
  accept the actual shape (``can_implement``), else library.

**The library path.** A bias and/or relu/gelu go through cuBLASLt's fused epilogue when
cuBLASLt takes the problem; bfloat16 goes through cuBLASLt (nvmath-python), the faster
of the two bf16 library paths (CuPy's own bf16 matmul is the slower one), and so do
batched float16/bfloat16 operands (one strided-batched cuBLASLt GEMM: CuPy 14's batched
matmul computes 16-bit operands in float32 copies, and fails on bfloat16); everything
else through cuBLAS (``cupy.matmul``), which batches 3-D operands in one strided-batched
call.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["BUCKET_MARGIN", "CALLABLE", "EXACT_MARGIN", "LABELS", "library_path",
           "tuned_verdict"]

#: How much faster than the library a bucketed match must have been at its own shape.
BUCKET_MARGIN = 0.03
#: How much faster than the library an exact match must have been in its tuning run.
EXACT_MARGIN = 0.02
#: Baselines naming a library ``pl.matmul`` can call itself.
CALLABLE = ("cublas", "cublaslt")
#: Display names.
LABELS = {"cublas": "cuBLAS", "cublaslt": "cuBLASLt", "torch": "torch.matmul",
          "cutlass": "CUTLASS", "skinny": "skinny GEMM", "cublaslt-tuned": "tuned cuBLASLt",
          "numpy": "NumPy"}


def tuned_verdict(time_ms: float | None, match: str, baselines: Mapping[str, float],
                  callable_libs: tuple[str, ...] = CALLABLE) -> tuple[bool, str]:
    """Whether a tuned kernel may run, by the never-slower rule, and why.

    Parameters
    ----------
    time_ms
        The tuned kernel's measured time (its ``"ok"`` row).
    match
        ``"exact"`` or ``"bucket"`` (see :meth:`TuningDB.lookup`).
    baselines
        ``library -> ms`` measured in the same tuning run.
    callable_libs
        The libraries ``pl.matmul`` can call here (cuBLASLt only with nvmath-python).

    Returns
    -------
    wins, why
        ``True`` and "tuned kernel 0.391 ms beat cuBLAS 0.398 ms in its tuning run", or
        ``False`` and "tuned kernel 0.412 ms lost to cuBLAS 0.398 ms in its tuning run".
    """
    libs = {k: v for k, v in baselines.items() if k in callable_libs and v and v > 0}
    if time_ms is None or not libs:
        have = ", ".join(sorted(baselines)) or "none"
        return False, (f"its tuning run recorded no time of a library pl.matmul can call "
                       f"(baselines: {have}), so nothing shows it is faster")
    name, lib_ms = min(libs.items(), key=lambda kv: (kv[1], kv[0]))
    label = LABELS.get(name, name)
    if match == "bucket":
        need = lib_ms * (1.0 - BUCKET_MARGIN)
        if time_ms < need:
            return True, (f"tuned kernel {time_ms:.3f} ms beat {label} {lib_ms:.3f} ms in its "
                          f"tuning run by at least {BUCKET_MARGIN:.0%}")
        return False, (f"tuned kernel {time_ms:.3f} ms lost to {label} {lib_ms:.3f} ms in its "
                       f"tuning run (a bucket match must win by {BUCKET_MARGIN:.0%})")
    if time_ms < lib_ms * (1.0 - EXACT_MARGIN):
        return True, f"tuned kernel {time_ms:.3f} ms beat {label} {lib_ms:.3f} ms in its tuning run"
    if time_ms < lib_ms:
        return False, (f"tuned kernel {time_ms:.3f} ms beat {label} {lib_ms:.3f} ms in its "
                       f"tuning run by less than {EXACT_MARGIN:.0%}, within the spread "
                       "between runs")
    return False, f"tuned kernel {time_ms:.3f} ms lost to {label} {lib_ms:.3f} ms in its tuning run"


def library_path(dtype: str, fused_why: str | None, plain_lt_why: str,
                 batched: bool = False) -> tuple[str, str]:
    """The library implementation for a problem no tuned kernel serves.

    Parameters
    ----------
    dtype
        The operands' dtype name.
    fused_why
        ``None`` without an epilogue; else why cuBLASLt cannot fuse it (``""``: it can).
    plain_lt_why
        Why cuBLASLt cannot run the plain GEMM (``""``: it can).
    batched
        Whether the operands stay batched (3-D ``b``, or a 3-D ``a`` not folded): CuPy
        14's batched matmul computes float16/bfloat16 in float32 copies (and fails on
        bfloat16), so 16-bit batches go to cuBLASLt's strided-batched GEMM.

    Returns
    -------
    impl, why
        ``"cublaslt"`` or ``"cublas"``, and the reason.
    """
    if fused_why == "":
        return "cublaslt", "bias/activation in cuBLASLt's epilogue"
    if fused_why is not None:
        return "cublas", f"cuBLAS and CuPy for the epilogue ({fused_why})"
    if batched and dtype in ("float16", "bfloat16"):
        if plain_lt_why == "":
            return "cublaslt", (f"batched {dtype}: one cuBLASLt strided-batched GEMM "
                                "through nvmath-python (CuPy's batched matmul computes "
                                "16-bit operands in float32 copies)")
        return "cublas", f"batched {dtype}: cupy.matmul in float32 ({plain_lt_why})"
    if dtype == "bfloat16":
        if plain_lt_why == "":
            return "cublaslt", ("bfloat16: cuBLASLt through nvmath-python (CuPy's bfloat16 "
                                "matmul is the slower library path)")
        return "cublas", f"bfloat16 through cupy.matmul ({plain_lt_why})"
    return "cublas", "cuBLAS (cupy.matmul)"
