"""Activation checkpointing: run a function without keeping its activations, and run it
again during backward to get them back. Gradients equal those without checkpointing.

use_reentrant=False (PyTorch's recommended form): the function runs with grad enabled and
records its ordinary graph, but under saved-tensor hooks (autograd/graph.py) that keep a
small placeholder instead of each tensor an op saves. The first unpack of a backward call
reruns the function (same inputs, same random state) under hooks that collect what it
saves, and each placeholder gives back its recomputed tensor once. A rerun that saves
fewer tensors, or tensors of other shapes or dtypes, is an error; it stops as soon as it
has saved as many as the forward did.

use_reentrant=True (the default when unspecified, with PyTorch's warning): one custom
Function, CheckpointFunctionBackward, whose forward runs the function under no_grad and
keeps only its inputs; its backward reruns it and backpropagates through the rerun, so it
only works inside a backward() without `inputs` (PyTorch's rule).
"""
import contextlib
import itertools
import os
import threading
import traceback
import warnings
import weakref

from jitgrad._core import modes as _grad_mode
from jitgrad.autograd.function import Function
from jitgrad.autograd.graph import saved_tensors_hooks
from jitgrad.engine import run as _engine
from jitgrad.graph.tensor import Tensor, rng_state, set_rng_state

_REENTRANT_UNSPECIFIED = (
    "torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly. Starting in PyTorch 2.9, "
    "calling checkpoint without use_reentrant will raise an exception. use_reentrant=False is recommended, but if "
    "you need to preserve the current default behavior, you can pass use_reentrant=True. Refer to docs for more "
    "details on the differences between the two variants.")
_SEQUENTIAL_REENTRANT_UNSPECIFIED = (
    "torch.utils.checkpoint.checkpoint_sequential: the use_reentrant parameter should be passed explicitly. In "
    "version 2.9 we will raise an exception if use_reentrant is not passed. use_reentrant=False is recommended, but "
    "if you need to preserve the current default behavior, you can pass use_reentrant=True. Refer to docs for more "
    "details on the differences between the two variants.")


class CheckpointError(RuntimeError):
    """A non-reentrant checkpoint's rerun did not match its forward (torch's class name)."""


# what torch's determinism errors end with (its torch.compile paragraph has no jitgrad meaning)
_TIP = ("\nTip: To see a more detailed error message, either pass `debug=True` to\n"
        "`torch.utils.checkpoint.checkpoint(...)` or wrap the code block\n"
        "with `with torch.utils.checkpoint.set_checkpoint_debug_enabled(True):` to\n"
        "enable checkpoint\u2011debug mode globally.\n")

# debug=True: torch's report, its operator logs being here the log of the tensors the
# forward and the rerun saved (jitgrad has no operator dispatch to log), each with the
# user's stack where it was saved
_DEBUG_REPORT = """ An error happened while unpacking tensors; dumping logs of latest computation
because you passed `debug=True` to `torch.utils.checkpoint.checkpoint()`.
Scroll all the way down for guidance on how to navigate these logs.

+~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~+
|        1. Stack traces of the tensors saved in the original forward          |
+------------------------------------------------------------------------------+

{forward_traces}
+~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~+
|        2. Stack traces of the tensors saved during recomputation             |
+------------------------------------------------------------------------------+

{recompute_traces}
+~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~+
|       3. Log of tensors saved in the original forward and recomputation     |
+------------------------------------------------------------------------------+
(Scroll up to correlate stack traces with each tensor listed below.)

Tensors saved during the original forward:

{forward_ops}

Tensors saved during recomputation:

{recompute_ops}

+------------------------------------------------------------------------------+
 ERROR: Detected non-determinism while running activation checkpointing

 You are seeing this error because you passed `debug=True` to checkpoint and
 tensors to be saved during the original forward and differ between those saved
 during recomputation. This can happen if different operators were ran in the
 original forward and in the recomputation.

 To identify where the mismatch may be coming from, compare the tensors saved
 during the original forward and during recomputation (listed above in the order
 they were saved), and review where in your code each was saved.

 Note that the logs can be quite long. Here's how they are structured:
 (Tip: you can Ctrl-f for these headers)

 1. Stack traces of the tensors saved in the original forward
 2. Stack traces of the tensors saved during recomputation
 3. Log of tensors saved in the original forward and recomputation
 4. Error message                                             <--- You are here
--------------------------------------------------------------------------------
"""

_debug_enabled = [None]  # set_checkpoint_debug_enabled: None defers to each checkpoint's `debug`


@contextlib.contextmanager
def set_checkpoint_debug_enabled(enabled):
    """Within this context every non-reentrant checkpoint runs with debug=enabled (None:
    as each one asks), as torch's."""
    prev, _debug_enabled[0] = _debug_enabled[0], enabled
    try:
        yield
    finally:
        _debug_enabled[0] = prev


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _log_entry(t, log):
    """debug mode: a saved tensor as torch's logs print a value (f32[2, 3]) and the user's
    frames where it was saved."""
    short = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16"}
    dt = str(t.dtype).split(".")[-1]
    frames = [f for f in traceback.extract_stack() if not f.filename.startswith(_PACKAGE)]
    log.append((f"${len(log)}: {short.get(dt, dt)}[{', '.join(map(str, t.shape))}]",
                [f"{f.filename}:{f.lineno}:{f.name}" for f in frames]))


def _traces(label, log):
    return "".join(f"{entry}   ({i + 1} of {len(log)} in {label})\n\n" + "\n".join(tb) + "\n\n\n"
                   for i, (entry, tb) in enumerate(log))


def noop_context_fn():
    return contextlib.nullcontext(), contextlib.nullcontext()


class _EarlyStop(threading.local):
    enabled = True


_early_stop = _EarlyStop()


@contextlib.contextmanager
def set_checkpoint_early_stop(enable):
    """Within this context, non-reentrant checkpoints made here rerun their function to the
    end (enable=False) or stop once every tensor is recomputed (True, the default)."""
    prev, _early_stop.enabled = _early_stop.enabled, bool(enable)
    try:
        yield
    finally:
        _early_stop.enabled = prev


def _rng_state(preserve):
    return rng_state() if preserve else None


@contextlib.contextmanager
def _rng_as(state):
    """Run the body with the random state of the forward (dropout masks come out alike);
    the caller's stream continues afterwards as if the rerun had not drawn."""
    if state is None:
        yield
        return
    saved = rng_state()
    set_rng_state(state)
    try:
        yield
    finally:
        set_rng_state(saved)


# -- use_reentrant=True ------------------------------------------------------------------

class CheckpointFunction(Function):
    @staticmethod
    def forward(ctx, function, preserve_rng_state, *args):
        ctx.function = function
        ctx.rng_state = _rng_state(preserve_rng_state)
        ctx.tensor_indices = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        ctx.inputs = [None if isinstance(a, Tensor) else a for a in args]
        ctx.save_for_backward(*[a for a in args if isinstance(a, Tensor)])
        with _grad_mode.no_grad():
            return function(*args)

    @staticmethod
    def backward(ctx, *grads):
        if not _engine.checkpoint_valid():
            raise RuntimeError("When use_reentrant=True, torch.utils.checkpoint is incompatible with .grad() or "
                               "passing an `inputs` parameter to .backward(). To resolve this error, you can "
                               "either set use_reentrant=False, or call .backward() without passing the `inputs` "
                               "argument.")
        inputs = list(ctx.inputs)
        for i, t in zip(ctx.tensor_indices, ctx.saved_tensors):
            d = t.detach()
            d.requires_grad = t.requires_grad
            inputs[i] = d
        with _rng_as(ctx.rng_state), _grad_mode.enable_grad():
            outputs = ctx.function(*inputs)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grads) if isinstance(o, Tensor) and o.requires_grad]
        if not pairs:
            raise RuntimeError("none of output has requires_grad=True, this checkpoint() is not necessary")
        # backward(), as PyTorch: parameters the function uses (a module's weights) get
        # their .grad here; the inputs' gradients are read off the detached copies
        _engine.backward([o for o, _ in pairs], [g for _, g in pairs])
        return (None, None) + tuple(a.grad if isinstance(a, Tensor) else None for a in inputs)


# -- use_reentrant=False -----------------------------------------------------------------

class _Holder:
    """What a checkpointed op keeps in place of a saved tensor: its position in the forward."""
    __slots__ = ("index", "__weakref__")

    def __init__(self, index):
        self.index = index


class _StopRecomputation(Exception):
    pass


def _metadata(t):
    return {"shape": t.shape, "dtype": t.dtype, "device": t.device}


_outside_backward = itertools.count(-1, -1)  # an unpack outside backward reruns each time


class _Frame:
    """One non-reentrant checkpoint call: what its forward saved, and per backward call the
    tensors its rerun produced, each handed out once."""

    def __init__(self, function, args, kwargs, rng_state, recompute_ctx, check, early_stop, debug=False):
        self.function, self.args, self.kwargs = function, args, kwargs
        self.debug = debug
        self.fwd_log, self.rec_log = [], []  # debug: what each run saved, and where
        self.rng_state = rng_state
        self.recompute_ctx = recompute_ctx
        self.check = check
        self.early_stop = early_stop
        self.metas = []
        self.holders = []  # weak: a holder whose node was freed needs no recomputation
        self.recomputed = {}  # backward call id -> {holder index: tensor}

    def pack(self, t):
        h = _Holder(len(self.metas))
        self.metas.append(_metadata(t))
        if self.debug:
            _log_entry(t, self.fwd_log)
        self.holders.append(weakref.ref(h))
        return h

    def unpack(self, holder):
        call = _engine.current_call()
        if call == 0:
            call = next(_outside_backward)
        values = self.recomputed.get(call)
        if values is None:
            try:
                values = self._recompute()
            except CheckpointError as e:
                if not self.debug:
                    raise
                raise CheckpointError(_DEBUG_REPORT.format(
                    forward_traces=_traces("original", self.fwd_log), recompute_traces=_traces("recompute", self.rec_log),
                    forward_ops="\n".join(entry for entry, _ in self.fwd_log),
                    recompute_ops="\n".join(entry for entry, _ in self.rec_log))) from e
            if call > 0:
                self.recomputed[call] = values
                _engine.queue_callback(lambda: self.recomputed.pop(call, None))
        if holder.index not in values:
            raise CheckpointError("torch.utils.checkpoint: Unpack is being triggered for a tensor that was already "
                                  "unpacked once. If you are calling ctx.saved_tensors in backward, make sure to do "
                                  "so only once. Otherwise please open an issue with details on your use case.")
        return values.pop(holder.index)

    def _recompute(self):
        values = {}
        metas = []
        n = len(self.metas)

        self.rec_log = []

        def pack(t):
            i = len(metas)
            if self.debug:
                _log_entry(t, self.rec_log)
            if i >= n:
                raise CheckpointError("torch.utils.checkpoint: trying to save more tensors during recomputation "
                                      "than during the original forward pass.\n" + _TIP)
            metas.append(_metadata(t))
            if self.holders[i]() is not None:
                values[i] = t.detach() if t.requires_grad else t  # saved as the forward saved it
            if self.early_stop and len(metas) == n:
                raise _StopRecomputation
            return None

        def unpack(_):
            raise CheckpointError("torch.utils.checkpoint: a tensor saved during recomputation was unpacked")

        try:
            with _rng_as(self.rng_state), saved_tensors_hooks(pack, unpack), _grad_mode.enable_grad(), \
                    self.recompute_ctx:
                self.function(*self.args, **self.kwargs)
        except _StopRecomputation:
            pass
        if len(metas) != n:
            raise CheckpointError("torch.utils.checkpoint: A different number of tensors was saved during the "
                                  f"original forward and recomputation.\nNumber of tensors saved during forward: "
                                  f"{n}\nNumber of tensors saved during recomputation: {len(metas)}.\n" + _TIP)
        if self.check:
            wrong = "".join(f"tensor at position {i}:\nsaved metadata: {self.metas[i]}\nrecomputed metadata: {m}\n"
                            for i, m in enumerate(metas) if i in values and m != self.metas[i])
            if wrong:
                raise CheckpointError("torch.utils.checkpoint: Recomputed values for the following tensors have "
                                      f"different metadata than during the forward pass.\n{wrong}.\n" + _TIP)
        return values


def _checkpoint_without_reentrant(function, preserve, context_fn, determinism_check, early_stop, debug, args,
                                  kwargs):
    if determinism_check not in ("default", "none"):
        raise ValueError(f"determinism_check should be one of ['default', 'none'], but got {determinism_check}")
    debug = debug if _debug_enabled[0] is None else _debug_enabled[0]
    if debug and context_fn is not noop_context_fn:
        raise ValueError("debug=True is incompatible with non-default context_fn")
    forward_ctx, recompute_ctx = context_fn()
    frame = _Frame(function, args, kwargs, _rng_state(preserve), recompute_ctx, determinism_check == "default",
                   _early_stop.enabled if early_stop is None else bool(early_stop), bool(debug))
    with saved_tensors_hooks(frame.pack, frame.unpack), forward_ctx:
        return function(*args, **kwargs)


def checkpoint(function, *args, use_reentrant=None, context_fn=noop_context_fn, determinism_check="default",
               debug=False, early_stop=None, **kwargs):
    """Run function(*args, **kwargs) keeping only what backward needs to run it again."""
    if use_reentrant is None:
        warnings.warn(_REENTRANT_UNSPECIFIED, stacklevel=2)
        use_reentrant = True
    preserve = kwargs.pop("preserve_rng_state", True)
    if use_reentrant:
        if kwargs:
            raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
        if context_fn is not noop_context_fn or debug is not False:
            raise ValueError("Passing `context_fn` or `debug` is only supported when use_reentrant=False.")
        return CheckpointFunction.apply(function, preserve, *args)
    return _checkpoint_without_reentrant(function, preserve, context_fn, determinism_check, early_stop, debug, args,
                                         kwargs)


def checkpoint_sequential(functions, segments, input, use_reentrant=None, **kwargs):
    """Run a sequence of modules (or an nn.Sequential) in `segments` checkpointed chunks;
    the last chunk runs normally, so the output has its graph."""
    if use_reentrant is None:
        warnings.warn(_SEQUENTIAL_REENTRANT_UNSPECIFIED, stacklevel=2)
        use_reentrant = True
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs:
        raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
    if hasattr(functions, "children"):  # nn.Sequential
        functions = list(functions.children())

    def run(start, end):
        def forward(x):
            for j in range(start, end + 1):
                x = functions[j](x)
            return x
        return forward

    size = len(functions) // segments
    end = -1
    for start in range(0, size * (segments - 1), size):
        end = start + size - 1
        input = checkpoint(run(start, end), input, use_reentrant=use_reentrant, preserve_rng_state=preserve)
    return run(end + 1, len(functions) - 1)(input)
