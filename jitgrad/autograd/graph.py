"""torch.autograd.graph: the graph's public surface. The nodes themselves are views of
tape rows (graph/node.py); this module adds what needs the engine (multi-grad hooks wait
for a backward call to end) and the saved-tensor hook context."""
from jitgrad._core.modes import pop_saved_hooks, push_saved_hooks
from jitgrad.engine import run as _engine
from jitgrad.graph.node import Node  # noqa: F401  (torch.autograd.graph.Node)


class saved_tensors_hooks:
    """Within this context, every tensor an op saves for backward is passed to
    pack_hook(tensor), which returns what is kept; backward calls unpack_hook(kept) to get
    a tensor back. Graphs recorded this way run on the Python engine, which unpacks."""

    def __init__(self, pack_hook, unpack_hook):
        self.pack_hook = pack_hook
        self.unpack_hook = unpack_hook

    def __enter__(self):
        self._tokens = getattr(self, "_tokens", [])  # one object may be entered again while entered
        self._tokens.append(push_saved_hooks(self.pack_hook, self.unpack_hook))
        return self

    def __exit__(self, *exc):
        pop_saved_hooks(self._tokens.pop())


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
