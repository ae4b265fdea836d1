"""Optimisation passes over the IR and the pass manager that runs them.

>>> from pyc_lab.compiler.passes import PassManager
>>> result = PassManager().run(graph)          # doctest: +SKIP
>>> result.graph.text(); result.to_frame()     # doctest: +SKIP

Passes (each a module with ``NAME`` and ``run(graph, ctx) -> bool``):

- ``canonicalize``: constants to the right of commutative ops, canonical reduction axes,
  identity transposes/reshapes removed;
- ``constant_folding``: nodes of constants only become constants;
- ``simplify``: algebraic identities that keep NaN/Inf semantics (never ``x*0 -> 0``);
- ``cheap_math``: ``x ** n`` (small integer ``n``, floats) as multiplications, within a
  stated number of ulp;
- ``gather_sinking``: a gather of an elementwise result gathers its operands instead,
  where that computes fewer elements (the pick of a loss never materialises ``logp``);
- ``cse`` and ``dce``: merge duplicates, drop what the outputs do not need;
- ``transpose_folding``: a matmul reads ``x`` instead of ``swapaxes(x, -1, -2)``;
- ``epilogue_fusion``: matmul + bias + activation in one GEMM;
- ``reduction_fusion``: hand-written softmax, layer norm and variance become one op;
- ``find_attention``: hand-written attention (``softmax(q @ k^T * s [+ mask]) @ v``,
  causal masking included) becomes one ``attention`` node;
- ``split_reduction``: a sum over a whole large array in two stages (row sums, then
  their sum), so that many blocks share it;
- ``small_reduction``: a reduction of at most 16 values per result over axes no
  reduction kernel takes (2x2 pooling as ``reshape(...).max((3, 5))``) as elementwise
  work on strided views, with the work before it that only it reads;
- ``arg_reductions``: argmax/argmin of floats over one axis as a max and a min of
  indices (NumPy's index exactly), which row fusion takes with what reads it;
- ``row_fusion``: any elementwise prologue -> reductions over any axes -> elementwise
  epilogue (RMS norm, log-softmax, masked softmax, norms...) becomes one ``fused_rows``
  row kernel, writing the row values that leave it (returned statistics) too;
- ``elementwise_fusion``: maximal elementwise groups become ``fused`` kernels (reading
  slices and transposes of their inputs in place, writing a concatenation piecewise);
- ``output_fusion``: a fused kernel whose value is a result or read elsewhere is computed
  inside the fused kernel that reads it, as one more output of that kernel.
"""

from __future__ import annotations

from .manager import DEFAULT_PIPELINE, MODES, PASSES, PassManager, PassRecord, PassResult
from .rewrite import PassContext

__all__ = ["DEFAULT_PIPELINE", "MODES", "PASSES", "PassContext", "PassManager", "PassRecord",
           "PassResult"]
