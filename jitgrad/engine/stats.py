"""Which engine ran each backward, and why: `jitgrad.autograd.engine_stats()`.

A backward call runs on the compiled engine (engine/compiled.py, engine/device.py) or,
for the whole call, on the per-node Python engine (engine/executor.py), which is one to
two orders of magnitude slower per node. Within a compiled call, single rows may be
handed back to Python by design (a custom Function, a node post-hook, a row at another
dtype than its tape's sweep): those are counted per reason too, without a warning.

The first time a call leaves the compiled engine for a given reason, a UserWarning says
so, naming the reason and the user's line that called backward (the first frame outside
jitgrad), so that a slow program is never slow silently. The counts are plain integers
updated under the GIL: exact for one thread, close enough to read trends with several.
"""
import os
import sys
import warnings

_counts = {"compiled": 0, "python": 0}
_python_reasons = {}   # reason -> calls the Python engine ran for it
_rows_in_python = {}   # reason -> rows a compiled call handed back for it
_warned = set()

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

# a call the user asked to run per node needs no warning (their line asked for it)
QUIET = frozenset({"anomaly detection is on"})


def compiled_call():
    _counts["compiled"] += 1


def python_call(reason):
    """A whole call ran on the Python engine for `reason`: count it, warn once per reason."""
    _counts["python"] += 1
    _python_reasons[reason] = _python_reasons.get(reason, 0) + 1
    if reason not in _warned and reason not in QUIET:
        _warned.add(reason)
        filename, lineno = user_line()
        warnings.warn_explicit(
            f"jitgrad: this backward ran on the Python engine, much slower than the compiled one, because "
            f"{reason}. jitgrad.autograd.engine_stats() counts such calls; this is said once per reason.",
            UserWarning, filename, lineno)


def handed_back(reason):
    _rows_in_python[reason] = _rows_in_python.get(reason, 0) + 1


def user_line():
    """(filename, line) of the innermost frame outside the jitgrad package."""
    f = sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(_PACKAGE):
        f = f.f_back
    return ("<unknown>", 0) if f is None else (f.f_code.co_filename, f.f_lineno)


def engine_stats():
    """Counts since the process started (or reset_engine_stats()):
    compiled_calls / python_calls: backward calls run by each engine;
    python_reasons: {reason: calls} for the Python engine's;
    rows_in_python: {reason: rows} that compiled calls handed back to Python one by one."""
    return {"compiled_calls": _counts["compiled"], "python_calls": _counts["python"],
            "python_reasons": dict(_python_reasons), "rows_in_python": dict(_rows_in_python)}


def reset_engine_stats(warnings_too=False):
    """Zero the counts; warnings_too: also say each reason's warning again."""
    _counts.update(compiled=0, python=0)
    _python_reasons.clear()
    _rows_in_python.clear()
    if warnings_too:
        _warned.clear()
