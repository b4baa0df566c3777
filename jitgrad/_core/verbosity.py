"""What jitgrad says on stderr: one line when it is about to compile for a while.

A first use compiles Numba code (seconds, once; cached afterwards). A user watching a
progress bar stuck at 0 deserves to know why, so the first backward that compiles says

    jitgrad: compiling the backward engine, kernels for mul, relu, addmm (first use; cached afterwards)

once per process, and so does the first compiled forward (a loss, a convolution, an
optimizer's update; named by its function). JITGRAD_VERBOSITY=0 (or
jitgrad.set_verbosity(0)) silences them; 2 prints every compile with its time, for
finding what a program compiles.
"""
import os
import sys
import threading

_lock = threading.Lock()
_local = threading.local()
_state = {"level": None, "said": set()}  # the kinds of compile announced so far


def _env_level():
    try:
        return int(os.environ.get("JITGRAD_VERBOSITY", "1"))
    except ValueError:
        return 1


def set_verbosity(level):
    """0: silent; 1 (default): say once per process that a compile is starting; 2: say
    every compile, with its time."""
    if not isinstance(level, int) or isinstance(level, bool) or level < 0:
        raise ValueError(f"set_verbosity expects a non-negative int, but got {level!r}")
    _state["level"] = level


def get_verbosity():
    level = _state["level"]
    return _env_level() if level is None else level


class _InBackward:
    """Inside a backward, compiles of single functions are not announced: the kernel
    table's line has named what the backward compiles."""

    def __enter__(self):
        _local.depth = getattr(_local, "depth", 0) + 1

    def __exit__(self, *exc):
        _local.depth -= 1


in_backward = _InBackward()


def compiling(names, kind="backward"):
    """Called just before `names` (kernels, the backward engine...) are compiled; `kind`
    ("backward": the kernel table's; "forward": any other) is said once per process."""
    level = get_verbosity()
    if level <= 0 or not names or (kind == "forward" and level < 2 and getattr(_local, "depth", 0)):
        return
    with _lock:
        if kind in _state["said"] and level < 2:
            return
        _state["said"].add(kind)
    print(f"jitgrad: compiling {', '.join(names)} (first use; cached afterwards)", file=sys.stderr, flush=True)


def compiled(names, seconds):
    """Called after a compile that compiling() announced: its time, at verbosity 2."""
    if get_verbosity() >= 2 and names:
        print(f"jitgrad: compiled {', '.join(names)} in {seconds:.2f} s", file=sys.stderr, flush=True)
