"""Activation checkpointing: run a function without keeping its activations, and run it
again during backward to get them back.

Both variants run through one custom Function (CheckpointFunctionBackward, PyTorch's
reentrant variant): the forward runs `function` under no_grad and keeps only its inputs;
the backward recomputes it with grad enabled and backpropagates through the recomputed
graph. Gradients equal those without checkpointing. use_reentrant=False gives the same
gradients through the same node (PyTorch builds it on saved-tensor hooks instead).
"""
import warnings

import numpy as np

from jitgrad._core import modes as _grad_mode
from jitgrad.autograd import grad as _grad
from jitgrad.autograd.function import Function
from jitgrad.graph.tensor import Tensor, _rng
from jitgrad.ops import functional as F


class CheckpointFunction(Function):
    @staticmethod
    def forward(ctx, function, preserve_rng_state, *args):
        ctx.function = function
        ctx.preserve_rng_state = preserve_rng_state
        if preserve_rng_state:
            ctx.rng_state = _rng[0].bit_generator.state  # dropout-style randomness replays alike
        ctx.tensor_indices = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        ctx.inputs = [None if isinstance(a, Tensor) else a for a in args]
        ctx.save_for_backward(*[a for a in args if isinstance(a, Tensor)])
        with _grad_mode.no_grad():
            return function(*args)

    @staticmethod
    def backward(ctx, *grads):
        inputs = list(ctx.inputs)
        tensors = ctx.saved_tensors
        for i, t in zip(ctx.tensor_indices, tensors):
            d = t.detach()
            d.requires_grad = t.requires_grad
            inputs[i] = d
        if ctx.preserve_rng_state:
            saved, _rng[0].bit_generator.state = _rng[0].bit_generator.state, ctx.rng_state
        try:
            with _grad_mode.enable_grad():
                outputs = ctx.function(*inputs)
        finally:
            if ctx.preserve_rng_state:
                _rng[0].bit_generator.state = saved
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grads) if isinstance(o, Tensor) and o.requires_grad]
        if not pairs:
            raise RuntimeError("none of output has requires_grad=True, this checkpoint() is not necessary")
        wanted = [i for i in ctx.tensor_indices if inputs[i].requires_grad]
        # grad(), not backward(): the gradients come back once, with nothing accumulated on
        # the recomputed inputs and nothing kept past this call
        found = _grad([o for o, _ in pairs], [inputs[i] for i in wanted],
                      [g if g is not None else F._wrap(np.zeros_like(o._data)) for o, g in pairs],
                      allow_unused=True)
        result = [None] * len(inputs)
        for i, g in zip(wanted, found):
            result[i] = g
        return (None, None) + tuple(result)


def checkpoint(function, *args, use_reentrant=None, preserve_rng_state=True, **kwargs):
    """Run function(*args) keeping only its inputs; recompute it during backward."""
    if use_reentrant is None:
        warnings.warn("torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly. "
                      "use_reentrant=False is recommended.", stacklevel=2)
    if kwargs:
        def function_with_kwargs(*a, _f=function):
            return _f(*a, **kwargs)
        return CheckpointFunction.apply(function_with_kwargs, preserve_rng_state, *args)
    return CheckpointFunction.apply(function, preserve_rng_state, *args)
