"""torch.utils.benchmark on jitgrad: a Timer that runs a statement string through Python's
timeit, as torch's does, and a Measurement that reports and prints like torch's.

What torch's Timer adds over timeit, kept here: a warm-up before each timeit (jitgrad
compiles kernels and records graphs on first use, so an unwarmed first run would dominate),
the thread count set for the measurement and restored after, and the label / sub_label /
description shown in the repr. Left out: the C++ timer (language="c++"), Callgrind counts
(collect_callgrind), CUDA synchronisation (jitgrad's CPU ops are synchronous) and the
Compare table."""
import textwrap
import timeit as _timeit
from contextlib import contextmanager

import numpy as np

from jitgrad._core.threads import get_num_threads, set_num_threads

__all__ = ["Timer", "Measurement", "TaskSpec"]

# torch's thresholds for the "Interquartile range is x% of the median" warnings
_IQR_WARN_THRESHOLD = 0.1
_IQR_GROSS_WARN_THRESHOLD = 0.25


class TaskSpec:
    """What was measured (everything of a Timer but its globals)."""

    def __init__(self, stmt, setup="pass", global_setup="", label=None, sub_label=None, description=None,
                 env=None, num_threads=1):
        self.stmt, self.setup, self.global_setup = stmt, setup, global_setup
        self.label, self.sub_label, self.description = label, sub_label, description
        self.env, self.num_threads = env, num_threads

    @property
    def title(self):
        sub = f": {self.sub_label}" if self.sub_label else ""
        if self.label is not None:
            return self.label + sub
        if "\n" not in self.stmt:
            return self.stmt + sub
        return f"stmt:{f' ({self.sub_label})' if self.sub_label else ''}\n{textwrap.indent(self.stmt, '  ')}"

    def setup_str(self):
        if self.setup == "pass" or not self.setup:
            return ""
        if "\n" in self.setup:
            return f"setup:\n{textwrap.indent(self.setup, '  ')}"
        return f"setup: {self.setup}"

    def summarize(self):
        sections = [self.title, self.description or "", self.setup_str()]
        return "\n".join(f"{s}\n" if "\n" in s else s for s in sections if s)


def _select_unit(t):
    """torch's unit choice: ns / us / ms by the power of 1000 of t (seconds), else s."""
    exp = int(np.floor(np.log10(t) // 3)) if t > 0 else -3
    unit = {-3: "ns", -2: "us", -1: "ms"}.get(exp, "s")
    return unit, {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[unit]


class Measurement:
    """One or more timings of a statement. raw_times are the seconds of each block of
    number_per_run runs; times, mean, median and iqr are per run."""

    def __init__(self, number_per_run, raw_times, task_spec, metadata=None):
        self.number_per_run = number_per_run
        self.raw_times = list(raw_times)
        self.task_spec = task_spec
        self.metadata = metadata
        sorted_times = np.sort(np.asarray(self.times, dtype=np.float64))
        self._sorted_times = tuple(sorted_times.tolist())
        self._median = float(np.quantile(sorted_times, 0.5))
        self._mean = float(sorted_times.mean())
        self._p25 = float(np.quantile(sorted_times, 0.25))
        self._p75 = float(np.quantile(sorted_times, 0.75))

    def __getattr__(self, name):
        # label, sub_label, description, stmt, num_threads ... read through, as torch's does
        if name != "task_spec" and "task_spec" in self.__dict__ and hasattr(self.task_spec, name):
            return getattr(self.task_spec, name)
        raise AttributeError(f"'Measurement' object has no attribute '{name}'")

    @property
    def times(self):
        return [t / self.number_per_run for t in self.raw_times]

    @property
    def median(self):
        return self._median

    @property
    def mean(self):
        return self._mean

    @property
    def iqr(self):
        return self._p75 - self._p25

    def meets_confidence(self, threshold=_IQR_WARN_THRESHOLD):
        return self.iqr / self.median < threshold

    @property
    def _warnings(self):
        if self.meets_confidence(_IQR_GROSS_WARN_THRESHOLD) and self.meets_confidence(_IQR_WARN_THRESHOLD):
            return ()
        why = ("This could indicate system fluctuation." if self.meets_confidence(_IQR_GROSS_WARN_THRESHOLD)
               else "This suggests significant environmental influence.")
        rel = self.iqr / self.median * 100
        return (f"  WARNING: Interquartile range is {rel:.1f}% of the median measurement.\n           {why}",)

    @property
    def has_warnings(self):
        return bool(self._warnings)

    def __repr__(self):
        n = len(self._sorted_times)
        unit, scale = _select_unit(self._median)
        lines = [object.__repr__(self), self.task_spec.summarize(),
                 f"  {'Median: ' if n > 1 else ''}{self._median / scale:.2f} {unit}"]
        if n >= 4:
            lines.append(f"  IQR:    {self.iqr / scale:.2f} {unit} ({self._p25 / scale:.2f} to {self._p75 / scale:.2f})")
        threads = self.task_spec.num_threads
        lines.append(f"  {n} measurement{'s' if n > 1 else ''}, {self.number_per_run} runs "
                     f"{'per measurement,' if n > 1 else ','} {threads} thread{'s' if threads > 1 else ''}")
        lines.extend(self._warnings)
        return "\n".join(lines).strip()

    __str__ = __repr__


@contextmanager
def _threads(n):
    before = get_num_threads()
    set_num_threads(n)
    try:
        yield
    finally:
        set_num_threads(before)


class Timer:
    """Time `stmt` (a string of Python) run in a namespace made of `globals`, after `setup`.

    timeit(number) runs stmt `number` times once, after a short warm-up, and returns a
    Measurement; blocked_autorange runs blocks of stmt until min_run_time has passed."""

    def __init__(self, stmt="pass", setup="pass", global_setup="", timer=_timeit.default_timer, globals=None,
                 label=None, sub_label=None, description=None, env=None, num_threads=1, language="python"):
        if not isinstance(stmt, str):
            raise ValueError("Currently only a `str` stmt is supported.")
        if language not in ("python", "py"):
            raise ValueError(f"jitgrad's Timer runs Python statements only, got language={language!r}")
        if global_setup:
            raise ValueError("global_setup is C++ only.")
        self._globals = dict(globals or {})
        # timeit compiles stmt and setup into one function; dedent them as torch does
        self._timer = _timeit.Timer(stmt=textwrap.dedent(stmt).strip() or "pass",
                                    setup=textwrap.dedent(setup).strip() or "pass",
                                    timer=timer, globals=self._globals)
        self._task_spec = TaskSpec(stmt=stmt, setup=setup, global_setup=global_setup, label=label,
                                   sub_label=sub_label, description=description, env=env, num_threads=num_threads)

    def _timeit(self, number):
        # no real statement takes under 1 ns; the floor keeps times and ratios finite, as torch's
        return max(self._timer.timeit(number=int(number)), 1e-9)

    def timeit(self, number=1000000):
        """Mirrors timeit.Timer.timeit: stmt `number` times, one Measurement."""
        with _threads(self._task_spec.num_threads):
            self._timeit(number=max(int(number // 100), 2))  # warm-up
            return Measurement(number_per_run=number, raw_times=[self._timeit(number=number)],
                               task_spec=self._task_spec)

    def repeat(self, repeat=-1, number=-1):
        raise NotImplementedError("See `Timer.blocked_autorange.`")

    def autorange(self, callback=None):
        raise NotImplementedError("See `Timer.blocked_autorange.`")

    def blocked_autorange(self, callback=None, min_run_time=0.2):
        """Blocks of `number` runs until min_run_time seconds have been measured. `number`
        grows by tens until the timer's own overhead is under 1e-4 of a block and a block
        takes at least min_run_time / 1000; those trial blocks are the warm-up."""
        with _threads(self._task_spec.num_threads):
            overhead = float(np.median([self._timeit(0) for _ in range(5)]))
            number = 1
            while True:
                taken = self._timeit(number)
                if (overhead / taken <= 1e-4 and taken >= min_run_time / 1000) or taken > min_run_time \
                        or number * 10 > 2147483647:
                    break
                number *= 10
            times, total = [], 0.0
            while total < min_run_time:
                spent = self._timeit(number)
                times.append(spent)
                total += spent
                if callback:
                    callback(number, spent)
        return Measurement(number_per_run=number, raw_times=times, task_spec=self._task_spec)
