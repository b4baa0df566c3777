"""Grad modes. The flag is thread-local, as in PyTorch: each thread records independently."""
import functools
import inspect
import threading
import warnings


class _State(threading.local):
    # class attributes are each thread's defaults; `_state.enabled` is read once per op
    enabled = True
    inference = False


_state = _State()
_inference_on = [0]  # threads in inference mode: tensor creation reads _state.inference only when some are


def is_grad_enabled():
    return _state.enabled


def _set(flag):
    _state.enabled = bool(flag)


def is_inference_mode_enabled():
    return _state.inference


_CLASS_DECORATED = ("Decorating classes is deprecated and will be disabled in future versions. You should only "
                    "decorate functions or methods. To preserve the current behavior of class decoration, you can "
                    "directly decorate the `__init__` method and nothing else.")


def _generator_in_mode(make_mode, gen_fn):
    """A decorated generator runs each of its steps in the mode, and the caller's code
    between steps in the caller's own mode: the mode is entered around every send(),
    throw() and close() into the wrapped generator, never held across a yield."""
    @functools.wraps(gen_fn)
    def generator(*args, **kwargs):
        gen = gen_fn(*args, **kwargs)
        try:
            with make_mode():
                item = gen.send(None)
            while True:
                try:
                    sent = yield item
                except GeneratorExit:
                    with make_mode():
                        gen.close()
                    raise
                except BaseException as exc:  # thrown in by the caller: the generator may handle it
                    with make_mode():
                        item = gen.throw(exc)
                else:
                    with make_mode():
                        item = gen.send(sent)
        except StopIteration as stop:
            return stop.value
    return generator


class _DecoratorContextManager:
    """Usable as `with mode():` and as `@mode()` / `@mode` like PyTorch's."""

    def __call__(self, fn):
        if inspect.isclass(fn):
            warnings.warn(_CLASS_DECORATED, FutureWarning, stacklevel=2)
            cls = fn
            fn = lambda *args, **kwargs: cls(*args, **kwargs)  # noqa: E731  (as torch: a function now)
        if inspect.isgeneratorfunction(fn):
            return _generator_in_mode(self._fresh, fn)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self._fresh():
                return fn(*args, **kwargs)
        return wrapper

    def _fresh(self):
        """A new context of the same mode: each call (and each generator step) enters its own."""
        return self.__class__(*self._args())

    def _args(self):
        return ()

    def __new__(cls, *args, **kwargs):
        # Support bare-decorator use: @no_grad without parentheses.
        if cls is not set_grad_enabled and len(args) == 1 and callable(args[0]) and not kwargs:
            return cls()(args[0])
        return super().__new__(cls)


class no_grad(_DecoratorContextManager):
    def __enter__(self):
        self.prev = is_grad_enabled()
        _set(False)

    def __exit__(self, *exc):
        _set(self.prev)


class enable_grad(_DecoratorContextManager):
    def __enter__(self):
        self.prev = is_grad_enabled()
        _set(True)

    def __exit__(self, *exc):
        _set(self.prev)


class set_grad_enabled(_DecoratorContextManager):
    """Takes effect at construction, like PyTorch, so the plain call form works too."""

    def __init__(self, mode):
        self.prev = is_grad_enabled()
        self.mode = bool(mode)
        _set(self.mode)

    def _args(self):
        return (self.mode,)

    def __enter__(self):
        pass

    def __exit__(self, *exc):
        _set(self.prev)

    def __call__(self, fn):
        _set(self.prev)  # the constructor already switched; a decorator must not
        return super().__call__(fn)


class inference_mode(_DecoratorContextManager):
    def __new__(cls, mode=True):
        if callable(mode):  # @inference_mode, or inference_mode(mode=fn), as PyTorch accepts
            return cls()(mode)
        return object.__new__(cls)

    def __init__(self, mode=True):
        self.mode = bool(mode)

    def _args(self):
        return (self.mode,)

    def __enter__(self):
        # as torch's InferenceMode guard: both modes are set, either way; inference_mode(False)
        # inside inference_mode() turns inference off and grad on for its body
        self.prev = (is_grad_enabled(), is_inference_mode_enabled())
        _set(not self.mode)
        _set_inference(self.mode)

    def __exit__(self, *exc):
        _set(self.prev[0])
        _set_inference(self.prev[1])


_counts = threading.Lock()  # _inference_on and _packing count over all threads: `+=` under it


def _set_inference(flag):
    delta = flag - _state.inference
    if delta:
        with _counts:
            _inference_on[0] += delta
    _state.inference = flag


# --- anomaly mode and saved_tensors_hooks: thread state that recording reads per op ---
_anomaly = [False]  # set by anomaly mode; read here so recording checks it cheaply
_check_nan = [True]  # anomaly mode's check_nan: backward checks each node's gradients for NaN


class _AnomalyParent(threading.local):
    node = None  # anomaly mode: the node whose backward runs now; nodes it records name it their parent


_anomaly_parent = _AnomalyParent()


class _SavedHooks(threading.local):
    stack = ()       # (pack, unpack) pairs of the active saved_tensors_hooks contexts
    disabled = None  # disable_saved_tensors_hooks' message: while set, no hooks may be pushed


_saved_hooks = _SavedHooks()
_packing = [0]  # how many saved_tensors_hooks contexts are active in any thread

# torch's words when a context exits more often than it was entered (its TLS stack's assert)
POP_EMPTY_ERROR = ("is_initialized && !tls.stack.empty() INTERNAL ASSERT FAILED: saved_tensors_hooks exited more "
                   "times than it was entered")


def _set_saved_hooks(stack):
    delta = len(stack) - len(_saved_hooks.stack)
    if delta:
        with _counts:
            _packing[0] += delta
    _saved_hooks.stack = stack


def push_saved_hooks(pack, unpack):
    """Push on this thread's stack, as torch's _push_saved_tensors_default_hooks."""
    if _saved_hooks.disabled is not None:
        raise RuntimeError(_saved_hooks.disabled)
    _set_saved_hooks(_saved_hooks.stack + ((pack, unpack),))


def pop_saved_hooks():
    """Pop the innermost entry, whichever context pushed it (torch's stack has no owners:
    contexts exited out of order pop each other's entries, as there)."""
    stack = _saved_hooks.stack
    if not stack:
        raise RuntimeError(POP_EMPTY_ERROR)
    _set_saved_hooks(stack[:-1])


def set_saved_hooks_disabled(message):
    """disable_saved_tensors_hooks: None enables them again."""
    _saved_hooks.disabled = message


def saved_hooks_state():
    """This thread's saved-tensor-hooks state, for restore_saved_hooks. The engine runs a
    backward under the state it began with and restores it after (torch's graph task
    keeps the thread-local state of its call), so contexts a hook or a Function enters or
    exits during backward do not outlive it."""
    return _saved_hooks.stack, _saved_hooks.disabled


def restore_saved_hooks(state):
    stack, _saved_hooks.disabled = state
    _set_saved_hooks(stack)
