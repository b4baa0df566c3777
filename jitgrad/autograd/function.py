"""Custom autograd Functions (torch.autograd.Function): the public class. Its node, ctx
and lowering live in graph/pynode.py."""
import contextlib
import functools
import inspect
import warnings

from jitgrad._core import modes as _grad_mode
from jitgrad._core.capture import stop as _stop
from jitgrad._core.forward import state as _fw
from jitgrad._core.messages import size_str
from jitgrad.graph.pynode import FunctionCtx, FunctionNode, FunctionState, record  # noqa: F401  (FunctionCtx: public)
from jitgrad.graph.tensor import Tensor
from jitgrad.ops import _forward
from jitgrad.ops import functional as F


def once_differentiable(fn):
    """Marks a backward as not differentiable. Under create_graph its results carry a node
    that raises if something later backpropagates through them, as in PyTorch."""
    @functools.wraps(fn)
    def wrapper(ctx, *args):
        with _grad_mode.no_grad():
            outputs = fn(ctx, *args)
        if not _grad_mode.is_grad_enabled():
            return outputs
        if not any(isinstance(a, Tensor) and a.requires_grad for a in args):
            return outputs
        single = not isinstance(outputs, tuple)
        outs = (outputs,) if single else outputs
        fakes = []
        for o in outs:
            if isinstance(o, Tensor):
                o = o.detach()
                o._requires_grad = True
            fakes.append(o)
        wrapped = _DelayedError.apply(*fakes)
        return wrapped if single or not isinstance(wrapped, Tensor) else (wrapped,)
    return wrapper


class _FunctionMeta(type):
    def __init__(cls, name, bases, attrs):
        super().__init__(name, bases, attrs)
        cls._backward_cls = type(name + "Backward", (FunctionState,), {"_fn": cls})
        cls._node_cls = type(name + "Backward", (FunctionNode,), {"__slots__": ()})


class Function(metaclass=_FunctionMeta):
    """Subclass with static forward(ctx, *args) (or forward(*args) plus setup_context)
    and backward(ctx, *grads); call with `apply`."""

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError("You must implement the forward function for custom autograd.Function.")

    @staticmethod
    def setup_context(ctx, inputs, output):
        raise NotImplementedError("setup_context is not implemented.")

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise NotImplementedError("You must implement either the backward or vjp method for your custom "
                                  "autograd.Function to use it with backward mode AD.")

    vjp = backward

    def __init__(self, *args, **kwargs):
        warnings.warn(f"{type(self)} should not be instantiated. Methods on autograd functions are all static, so "
                      "you should invoke them on the class itself. Instantiating an autograd function will raise an "
                      "error in a future version of PyTorch.", DeprecationWarning, stacklevel=2)

    def __call__(self, *args, **kwargs):
        # the legacy form (an instance with a non-static forward) is gone from PyTorch
        raise RuntimeError("Legacy autograd function with non-static forward method is deprecated. Please use "
                           "new-style autograd function with static forward method. (Example: "
                           "https://pytorch.org/docs/stable/autograd.html#torch.autograd.Function)")

    @classmethod
    def apply(cls, *args, **kwargs):
        _stop(f"custom autograd.Function {cls.__name__}")
        ctx = object.__new__(cls._backward_cls)
        ctx._released = False
        ctx.materialize_grads = True
        setup = cls.setup_context is not Function.setup_context
        if setup:
            # forward(*inputs) + setup_context: inputs are bound, defaults included
            bound = inspect.signature(cls.forward).bind(*args, **kwargs)
            bound.apply_defaults()
            args, kwargs = bound.args, {}
        inputs = args + tuple(kwargs.values())  # keyword arguments are inputs too
        ctx.needs_input_grad = tuple(isinstance(a, Tensor) and a.requires_grad for a in inputs)
        dual = _fw.live and any(isinstance(a, Tensor) and _forward.tangent(a) is not None for a in inputs)
        # as in PyTorch, forward sees its inputs without tangents: `jvp` gives the outputs'
        with _grad_mode.no_grad(), (_forward._paused if dual else contextlib.nullcontext()):
            if setup:
                outputs = cls.forward(*args)
                cls.setup_context(ctx, args, outputs)
            else:
                outputs = cls.forward(ctx, *args, **kwargs)
        if _grad_mode.is_grad_enabled() and any(ctx.needs_input_grad):
            outputs = record(ctx, inputs, outputs)
        if dual:
            _forward_tangents(cls, ctx, inputs, outputs)
        return outputs

    @staticmethod
    def jvp(ctx, *grad_inputs):
        raise NotImplementedError("You must implement the jvp function for custom autograd.Function to use it with "
                                  "forward mode AD.")


def _forward_tangents(cls, ctx, inputs, outputs):
    """Forward mode through a custom Function: its `jvp(ctx, *tangents)` gives the outputs'
    tangents. An input Tensor without a tangent passes zeros, a non-Tensor None (PyTorch's
    convention); ctx.saved_tensors are then the ones given to ctx.save_for_forward."""
    if cls.jvp is Function.jvp:
        Function.jvp(ctx)
    with _forward._paused:
        tangents = []
        for a in inputs:
            tg = _forward.tangent(a) if isinstance(a, Tensor) else None
            tangents.append(tg if tg is not None or not isinstance(a, Tensor) else F.zeros_like(a))
        ctx._in_jvp = True
        try:
            out_tangents = cls.jvp(ctx, *tangents)
        finally:
            ctx._in_jvp = False
    single = isinstance(outputs, Tensor)
    outs = (outputs,) if single else tuple(outputs)
    if not isinstance(out_tangents, tuple):
        out_tangents = (out_tangents,)
    if len(out_tangents) != len(outs):
        raise RuntimeError(f"Function {cls.__name__}.jvp returned an incorrect number of forward gradients "
                           f"(expected {len(outs)} but got {len(out_tangents)})")
    for o, tg in zip(outs, out_tangents):
        if isinstance(o, Tensor) and tg is not None:
            if tuple(tg.shape) != tuple(o.shape):
                raise RuntimeError("Trying to set a forward gradient that has a different size than that of the "
                                   f"original Tensor, this is not supported. Tensor is of size {size_str(o.shape)} "
                                   f"while the given forward gradient is of size {size_str(tg.shape)}.")
            _forward.set_tangent(o, tg)


class _DelayedError(Function):
    """What once_differentiable puts after its results under create_graph."""

    @staticmethod
    def forward(ctx, *grads):
        return grads[0] if len(grads) == 1 else grads

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError("trying to differentiate twice a function that was marked with @once_differentiable")


class _ErrorNode(FunctionNode):
    """PyTorch's node after a once_differentiable backward's results: class Error."""
    __slots__ = ()

    def name(self):
        return "torch::autograd::Error"


_ErrorNode.__name__ = _ErrorNode.__qualname__ = "Error"
_DelayedError._node_cls = _ErrorNode
