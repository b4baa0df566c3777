"""What PyTorch remembers about a view (its ViewInfo + CreationMeta), and the rules that
depend on it: which in-place writes are allowed, when a view's grad_fn is no longer
valid, and which tensors are inference tensors.

A view records its root base (a tensor that is not a view), a function that makes the
view's array from the root's array, and how it was made (`meta`). Views that take part in
autograd are also listed, weakly, on their root (`Rare.views`): an in-place write through
the root or any of its views then gives them a new history at once (ops/inplace.py), as
PyTorch does lazily when it finds a view's version behind its base's.
"""
import weakref

# how the view was made: PyTorch's CreationMeta
DEFAULT, NO_GRAD, INFERENCE, CUSTOM_FUNCTION, MULTI_OUTPUT = range(5)


class View:
    __slots__ = ("base", "fn", "meta", "invalid", "origin")

    def __init__(self, base, fn, meta, origin=None):
        self.base = base          # the root base tensor (never itself a view)
        self.fn = fn              # root array -> this view's array
        self.meta = meta
        self.invalid = False      # written in place since, and meta forbids it a new history
        self.origin = origin      # (output index, node name): a Function's output, or a view of a no_grad view


class Chain:
    """Array functions applied in turn: a view's fn from its root, kept flat so that a view
    of a view of ... (a loop reshaping a tensor) is not a deep nest of closures."""
    __slots__ = ("steps",)

    def __init__(self, first, then):
        self.steps = ((first.steps if type(first) is Chain else (first,))
                      + (then.steps if type(then) is Chain else (then,)))

    def __call__(self, arr):
        for step in self.steps:
            arr = step(arr)
        return arr


def info(t):
    x = t._x
    return None if x is None else x.view_of


def is_inference(t):
    x = t._x
    return x is not None and x.inference


made_inference = [False]  # some inference tensor was made: recording then checks what it saves


def mark_inference(t, rare):
    x = t._x
    if x is None:
        x = t._x = rare()
    x.inference = True
    made_inference[0] = True


def autograd_skips(inputs, saved):
    """Whether an op on `inputs` runs without autograd: as in PyTorch, where inference
    tensors lack the autograd dispatch key, one whose tensor inputs are all inference
    tensors. Else PyTorch's error if it would save an inference tensor (`saved`: the
    arrays it saves)."""
    if all(is_inference(t) for t in inputs):
        return True
    for t in inputs:
        if is_inference(t) and any(t._data is s for s in saved):
            raise RuntimeError("Inference tensors cannot be saved for backward. Please do not use Tensors created "
                               "in inference mode in computation tracked by autograd. To work around this, you can "
                               "make a clone to get a normal tensor and use it in autograd, or use "
                               "`torch.no_grad()` instead of `torch.inference_mode()`.")
    return False


def register(root, view, rare):
    """List `view` on its root, so that an in-place write can refresh it. (A list of
    weakrefs, pruned as it doubles: a WeakSet would compare tensors with ==.)"""
    x = root._x
    if x is None:
        x = root._x = rare()
    views = x.views
    if views is None:
        views = x.views = []
    views.append(weakref.ref(view))
    n = len(views)
    if n >= 8 and not n & (n - 1):
        live_views(root)


def live_views(root):
    """The registered views of root still alive (the dead ones are dropped)."""
    x = root._x
    if x is None or not x.views:
        return ()
    alive = {}
    for r in x.views:
        v = r()
        if v is not None:
            alive[id(v)] = v
    x.views = [weakref.ref(v) for v in alive.values()]
    return list(alive.values())


_FORBIDDEN = (" Given that this use case is ambiguous and error-prone, it is forbidden. You can clarify your code "
              "by moving both the view and the inplace either both inside the {block} block (if you don't want "
              "the inplace to be tracked) or both outside (if you want the inplace to be tracked).")
_MODES = {NO_GRAD: ("no_grad mode", "with grad mode enabled", "no_grad"),
          INFERENCE: ("inference mode", "in normal mode", "inference_mode")}


def inplace_error(view, indirect=False):
    """PyTorch's error for an in-place write on a view that its meta forbids; indirect:
    the write was through its base or another view of it, and the view's grad_fn (or
    is_leaf) is being read."""
    what = "its base or another view of its base has been modified inplace" if indirect else \
        "is being modified inplace"
    if view.meta in _MODES:
        made, now, block = _MODES[view.meta]
        head = "A view" if view.origin is None else f"Output {view.origin[0]} of {view.origin[1]} is a view of a view which"
        return RuntimeError(f"{head} was created in {made} and {what} {now}." + _FORBIDDEN.format(block=block))
    nr, name = view.origin
    if view.meta == MULTI_OUTPUT:
        why = ("This view is the output of a function that returns multiple views. Such functions do not allow "
               "the output views to be modified inplace. You should replace the inplace operation by an "
               "out-of-place one.")
    else:
        why = ("This view was created inside a custom Function (or because an input was returned as-is) and the "
               "autograd logic to handle view+inplace would override the custom backward associated with the "
               "custom Function, leading to incorrect gradients. This behavior is forbidden. You can fix this by "
               "cloning the output of the custom Function.")
    return RuntimeError(f"Output {nr} of {name} is a view and {what}. {why}")
