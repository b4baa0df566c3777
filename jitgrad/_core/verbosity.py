"""What jitgrad says on stderr: one line when it is about to compile for a while.

A first use compiles Numba code (seconds, once; cached afterwards). A user watching a
progress bar stuck at 0 deserves to know why, so the first compile of a process prints

    jitgrad: compiling kernels for mul, relu, addmm (first use; cached afterwards)

once. JITGRAD_VERBOSITY=0 (or jitgrad.set_verbosity(0)) silences it; 2 prints every
compile with its time, for finding what a program compiles.
"""
import os
import sys
import threading

_lock = threading.Lock()
_state = {"level": None, "said": False}


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


def compiling(names):
    """Called just before `names` (kernels, the backward engine...) are compiled."""
    level = get_verbosity()
    if level <= 0 or not names:
        return
    with _lock:
        if _state["said"] and level < 2:
            return
        _state["said"] = True
    print(f"jitgrad: compiling {', '.join(names)} (first use; cached afterwards)", file=sys.stderr, flush=True)


def compiled(names, seconds):
    """Called after a compile that compiling() announced: its time, at verbosity 2."""
    if get_verbosity() >= 2 and names:
        print(f"jitgrad: compiled {', '.join(names)} in {seconds:.2f} s", file=sys.stderr, flush=True)
