"""Grad modes. The flag is thread-local, as in PyTorch: each thread records independently."""
import functools
import threading

class _State(threading.local):
    # class attributes are each thread's defaults; `_state.enabled` is read once per op
    enabled = True
    inference = False


_state = _State()


def is_grad_enabled():
    return _state.enabled


def _set(flag):
    _state.enabled = bool(flag)


def is_inference_mode_enabled():
    return _state.inference


class _DecoratorContextManager:
    """Usable as `with mode():` and as `@mode()` / `@mode` like PyTorch's."""

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self.__class__(*self._args()):
                return fn(*args, **kwargs)
        return wrapper

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
    def __init__(self, mode=True):
        self.mode = bool(mode)

    def _args(self):
        return (self.mode,)

    def __enter__(self):
        # as torch's InferenceMode guard: both modes are set, either way; inference_mode(False)
        # inside inference_mode() turns inference off and grad on for its body
        self.prev = (is_grad_enabled(), is_inference_mode_enabled())
        _set(not self.mode)
        _state.inference = self.mode

    def __exit__(self, *exc):
        _set(self.prev[0])
        _state.inference = self.prev[1]
