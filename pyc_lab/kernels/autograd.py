"""torch autograd for pyc_lab's own calls: a forward that pyc_lab runs (its kernels, or
the library it chose) recorded with the backward pyc_lab gives for it.

:func:`differentiable` is the one ``torch.autograd.Function`` that ``pl.attention`` and
``pl.conv`` use on tensors that require gradients. The class is made on first use, so
importing this module never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["differentiable"]

_FUNCTION: Any = None


def differentiable(inputs: Sequence[Any], forward: Callable[[], tuple[Any, ...]],
                   backward: Callable[[tuple, tuple, tuple], Sequence[Any]],
                   non_differentiable: Sequence[int] = ()) -> tuple[Any, ...]:
    """Run ``forward()`` with torch's autograd recording ``backward`` as its gradient.

    Parameters
    ----------
    inputs
        The tensors the outputs depend on (``None`` for an absent one, e.g. no bias);
        the gradients are for these.
    forward
        ``forward() -> outputs``: a tuple of tensors, computed without autograd.
    backward
        ``backward(inputs, outputs, output_grads) -> input_grads``: one gradient (or
        ``None``) per input, from the saved inputs and outputs and the outputs'
        gradients (``None`` for a non-differentiable output).
    non_differentiable
        Indices of outputs that carry no gradient (a log-sum-exp).

    Returns
    -------
    tuple
        ``forward()``'s outputs, attached to the autograd graph.
    """
    global _FUNCTION
    if _FUNCTION is None:
        _FUNCTION = _make_function()
    return _FUNCTION.apply(forward, backward, tuple(non_differentiable), *inputs)


def _make_function() -> Any:
    import torch

    class _Differentiable(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, forward: Any, backward: Any, non_diff: tuple,
                    *inputs: Any) -> Any:
            outputs = tuple(forward())
            ctx.save_for_backward(*inputs, *outputs)
            ctx.n_inputs = len(inputs)
            ctx.backward_fn = backward
            ctx.mark_non_differentiable(*(outputs[i] for i in non_diff))
            return outputs

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            saved = ctx.saved_tensors
            inputs, outputs = saved[:ctx.n_inputs], saved[ctx.n_inputs:]
            return (None, None, None, *ctx.backward_fn(inputs, outputs, grads))

    return _Differentiable
