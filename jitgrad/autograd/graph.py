"""torch.autograd.graph: the graph's public surface. The nodes themselves are views of
tape rows (graph/node.py); this module adds what needs the engine (multi-grad hooks wait
for a backward call to end, gradient edges are inputs of grad()), the saved-tensor hook
context and the version counter bump."""
import contextlib

from jitgrad._core.modes import pop_saved_hooks, push_saved_hooks, saved_hooks_state, set_saved_hooks_disabled
from jitgrad.engine import run as _engine
from jitgrad.engine.run import GradientEdge, _target
from jitgrad.graph.node import Node  # noqa: F401  (torch.autograd.graph.Node)
from jitgrad.graph.saved import SavedTensor  # noqa: F401  (torch._C._autograd.SavedTensor: grad_fn._raw_saved_*)
from jitgrad.graph.tensor import Tensor


def get_gradient_edge(tensor):
    """The edge where tensor's gradient is computed: its grad_fn and output number, or a
    leaf's AccumulateGrad. grad(loss, get_gradient_edge(x)) equals grad(loss, x)."""
    if not tensor.requires_grad:
        raise RuntimeError("It is not possible to get the gradient edge for a Tensor that does not require gradients")
    if tensor.grad_fn is not None:
        return GradientEdge(tensor.grad_fn, tensor.output_nr)
    hold = []  # the sink's tape is held by the edge's node from here on
    return GradientEdge(_target(tensor, hold).node, 0)


def increment_version(tensor):
    """Count an in-place write made behind autograd's back (a custom kernel writing the
    storage): a later backward that needs the old value raises, as for any in-place op."""
    for t in (tensor,) if isinstance(tensor, Tensor) else tensor:
        t._bump()  # not through .data, whose writes torch does not count either


class saved_tensors_hooks:
    """Within this context, every tensor an op saves for backward is passed to
    pack_hook(tensor), which returns what is kept; backward calls unpack_hook(kept) to get
    a tensor back. Graphs recorded this way run on the Python engine, which unpacks."""

    def __init__(self, pack_hook, unpack_hook):
        self.pack_hook = pack_hook
        self.unpack_hook = unpack_hook

    def __enter__(self):
        push_saved_hooks(self.pack_hook, self.unpack_hook)
        return self

    def __exit__(self, *exc):
        # pops the innermost hooks, as torch's (RuntimeError on an empty stack)
        pop_saved_hooks()


class save_on_cpu(saved_tensors_hooks):
    """Saved tensors are kept on the host and moved back to their device when backward
    unpacks them (GPU memory traded for copies). pin_memory is accepted; host memory here
    is never pinned."""

    def __init__(self, pin_memory=False, device_type="cuda"):
        def pack(t):
            return t.device, t.cpu()

        def unpack(packed):
            device, t = packed
            return t.to(device)

        super().__init__(pack, unpack)


@contextlib.contextmanager
def disable_saved_tensors_hooks(error_message):
    """Within this context, entering saved_tensors_hooks raises RuntimeError(error_message)
    (so does entering this context while such hooks are active). A generator context, as
    torch's: it also decorates functions."""
    stack, prev = saved_hooks_state()
    if stack:
        raise RuntimeError(error_message)
    set_saved_hooks_disabled(error_message)
    try:
        yield
    finally:
        set_saved_hooks_disabled(prev)


class _MultiHandle:
    def __init__(self, handles):
        self.handles = handles

    def remove(self):
        for h in self.handles:
            h.remove()


def register_multi_grad_hook(tensors, fn, *, mode="all"):
    """mode "all": fn(grads) once per backward call, after the gradients of the given
    tensors are computed (None for those the call does not reach); mode "any": fn(grad)
    with the first of them computed in each call."""
    if mode not in ("all", "any"):
        raise ValueError(f"Expects mode to be one of ('all', 'any') but got {mode}")
    tensors = tuple(tensors)
    state = {"call": None, "grads": None}

    def make(i):
        def hook(grad):
            call = _engine.current_call()
            if mode == "any":
                if state["call"] != call:
                    state["call"] = call
                    fn(grad)
                return None
            if state["call"] != call:
                state["call"] = call
                grads = state["grads"] = [None] * len(tensors)
                _engine.queue_callback(lambda: fn(grads))
            state["grads"][i] = grad
            return None
        return hook

    return _MultiHandle([t.register_hook(make(i)) for i, t in enumerate(tensors) if t.requires_grad])
