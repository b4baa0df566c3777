"""Custom autograd Functions (torch.autograd.Function): the public class. Its node, ctx
and lowering live in graph/pynode.py."""
import contextlib
import functools
import inspect
import warnings

from jitgrad._core import modes as _grad_mode
from jitgrad._core import versions
from jitgrad._core.capture import stop as _stop
from jitgrad._core.forward import state as _fw
from jitgrad._core.messages import size_str
from jitgrad.graph import views as _views
from jitgrad.graph.pynode import FunctionCtx, FunctionNode, FunctionState, record  # noqa: F401  (FunctionCtx: public)
from jitgrad.graph.tensor import Tensor, _Rare
from jitgrad.ops import _forward
from jitgrad.ops import functional as F
from jitgrad.ops.inplace import rebase_dirty_view


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

    # ctx.saved_tensors may be read once; the ctx then lets go of them (torch's option)
    clear_saved_tensors_on_access = False

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
        dirty = getattr(ctx, "dirty_tensors", ())
        if dirty:
            _check_dirty(dirty, inputs, outputs)
        recorded = _grad_mode.is_grad_enabled() and any(ctx.needs_input_grad)
        if recorded:
            outputs = record(ctx, inputs, outputs)
        if _grad_mode.is_grad_enabled():
            _views_of_inputs(cls, inputs, outputs, dirty, recorded)
        ctx.dirty_tensors = ()  # the ctx is the node's: holding the outputs would keep them alive
        if dual:
            _forward_tangents(cls, ctx, inputs, outputs)
        return outputs

    @staticmethod
    def jvp(ctx, *grad_inputs):
        raise NotImplementedError("You must implement the jvp function for custom autograd.Function to use it with "
                                  "forward mode AD.")


def _check_dirty(dirty, inputs, outputs):
    """ctx.mark_dirty's rules, as PyTorch's: a non-input is warned about (an error for a
    view, with grad mode on); a marked input must be returned; a view of an input may be
    marked only where an in-place op on it would be allowed, and only by a Function with
    one output."""
    grad = _grad_mode.is_grad_enabled()
    outs = outputs if isinstance(outputs, tuple) else (outputs,)
    for t in dirty:
        if not any(t is a for a in inputs):
            msg = ("ctx.mark_dirty() received a tensor that was not an input. Only input Tensors that have been "
                   "mutated should be passed to ctx.mark_dirty().")
            if grad and _views.info(t) is not None:
                raise RuntimeError(msg)
            warnings.warn(msg, UserWarning, stacklevel=3)
            continue
        if not any(t is o for o in outs):
            raise RuntimeError("Some elements marked as dirty during the forward method were not returned as output. "
                               "The inputs that are modified inplace must all be outputs of the Function.")
        view = _views.info(t)
        if view is None or not grad or not (t.requires_grad or view.base.requires_grad):
            continue
        if view.meta != _views.DEFAULT:
            raise _views.inplace_error(view)
        if view.base.requires_grad and view.base.is_leaf:
            raise RuntimeError("a view of a leaf Variable that requires grad is being used in an in-place operation.")
        if sum(isinstance(o, Tensor) for o in outs) > 1:
            raise RuntimeError(
                "If your Function modifies inplace an input that is a view of another Tensor, your Function cannot "
                "return more than one Tensor. This is not supported by the current autograd engine. You should "
                "either make sure the input is not a view (using .clone() for example) or make your Function only "
                "return one Tensor (potentially splitting it into two Functions: one doing the inplace that returns "
                "a single Tensor and a second one that does the other operations). You can ask on the forum "
                "https://discuss.pytorch.org/ if you need help to do this change.")


def _views_of_inputs(cls, inputs, outputs, dirty, recorded):
    """Outputs sharing an input's storage, with grad mode on. A marked dirty view of an
    input rebases its base (the base's history then has the Function at the view's
    positions); any other one is a view made in a custom Function, which PyTorch forbids
    writing in place (its CreationMeta IN_CUSTOM_FUNCTION), since the base's history
    could not include it. (An input returned as itself by an unrecorded Function is left
    as it is: PyTorch would return a view of it.)"""
    outs = outputs if isinstance(outputs, tuple) else (outputs,)
    bases = {id(versions.base_of(t._data)): t for t in inputs if isinstance(t, Tensor)}
    for j, o in enumerate(outs):
        if not isinstance(o, Tensor):
            continue
        if any(o is t for t in dirty):
            if recorded and _views.info(o) is not None:
                rebase_dirty_view(o)
            continue
        src = bases.get(id(versions.base_of(o._data)))
        if src is None or any(o is t for t in inputs):
            continue
        root = src._base if src._is_view() else src
        if o._x is None:
            o._x = _Rare()
        o._x.view_of = _views.View(root, None, _views.CUSTOM_FUNCTION, (j, cls.__name__))
        if o.requires_grad:
            _views.register(root, o, _Rare)


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

    @property
    def next_functions(self):
        # torch's Error is a C++ node, which has an edge per input, (None, 0) for a None
        # (a custom Function's node has edges for its Tensor inputs only)
        edges = iter(super().next_functions)
        return tuple(next(edges) if is_tensor else (None, 0) for is_tensor in self._state._arg_is_tensor)


_ErrorNode.__name__ = _ErrorNode.__qualname__ = "Error"
_DelayedError._node_cls = _ErrorNode
