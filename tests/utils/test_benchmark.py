"""utils.benchmark.Timer / Measurement against torch.utils.benchmark: the statement runs in
the given globals after setup, as many times as torch's (the warm-up included), under the
thread count asked for; the Measurement's fields and its printed form (all but the object
address and the time) are torch's; the times are the statement's (a sleep measures at
least its length)."""
import importlib
import re
import time

import pytest
import torch
from conftest import LIBS, err_of

import jitgrad


def bench(T):
    return importlib.import_module(T.__name__ + ".utils.benchmark")


def shape_of(m):
    """The repr with the address and the numbers of seconds blanked."""
    text = re.sub(r"object at 0x[0-9a-f]+", "object at ADDR", repr(m))
    text = re.sub(r"\d+\.\d\d (ns|us|ms|s)\b", "T", text)
    return text.replace("jitgrad.utils.benchmark.Measurement", "torch.utils.benchmark.utils.common.Measurement")


def both(run):
    j, t = run(jitgrad), run(torch)
    assert j == t, f"jitgrad {j!r} != torch {t!r}"
    return j


@pytest.mark.parametrize("number", [1, 10, 250])
def test_timeit_runs_the_statement_number_times_after_the_warm_up(number):
    def run(T):
        calls = []
        m = bench(T).Timer("f()", setup="calls.append('setup')", globals={"f": lambda: calls.append(1),
                                                                           "calls": calls}).timeit(number)
        return calls.count(1), calls.count("setup"), m.number_per_run, len(m.times), len(m.raw_times)
    both(run)


@pytest.mark.parametrize("kw", [
    dict(stmt="x.sin()"),
    dict(stmt="x.sin()", label="L", sub_label="S", description="D"),
    dict(stmt="x.sin()", sub_label="S"),
    dict(stmt="y = x.sin()\nz = y + 1", setup="import math\nw = 1"),
    dict(stmt="x.sin()", setup="w = 1", num_threads=2),
    dict(stmt="x.sin()", label="only a label"),
])
def test_measurement_prints_like_torch(kw):
    both(lambda T: shape_of(bench(T).Timer(globals={"x": T.ones(3)}, **kw).timeit(20)))


@LIBS
def test_measurement_fields(T):
    m = bench(T).Timer("x + 1", globals={"x": T.ones(2)}, label="L", sub_label="S", description="D").timeit(7)
    assert m.number_per_run == 7 and len(m.raw_times) == 1
    assert m.times == [m.raw_times[0] / 7]
    assert m.mean == pytest.approx(m.times[0]) and m.median == pytest.approx(m.times[0]) and m.iqr == 0
    assert (m.title, m.label, m.sub_label, m.description, m.stmt, m.num_threads) == ("L: S", "L", "S", "D", "x + 1", 1)
    assert not m.has_warnings
    with pytest.raises(AttributeError):
        m.not_a_field  # noqa: B018


@LIBS
def test_times_measure_the_statement(T):
    m = bench(T).Timer("time.sleep(0.002)", globals={"time": time}).timeit(5)
    assert 0.002 <= m.mean < 0.2 and m.times[0] == m.mean


@LIBS
def test_the_thread_count_is_set_for_the_run_and_restored(T):
    before = T.get_num_threads()
    seen = []
    bench(T).Timer("seen.append(T.get_num_threads())", globals={"seen": seen, "T": T}, num_threads=2).timeit(3)
    assert set(seen) == {2} and T.get_num_threads() == before


@LIBS
def test_blocked_autorange(T):
    seen = []
    m = bench(T).Timer("seen.append(1)", globals={"seen": seen}).blocked_autorange(min_run_time=0.02)
    assert sum(m.raw_times) >= 0.02 and len(m.times) == len(m.raw_times) >= 1
    assert m.number_per_run >= 1 and len(seen) >= m.number_per_run * len(m.raw_times)
    assert sorted(m.times)[0] <= m.median <= sorted(m.times)[-1]
    text = repr(m)
    assert "runs per measurement" in text or "1 measurement" in text


def test_errors_as_torch():
    both(lambda T: err_of(bench(T).Timer, stmt=lambda: 1))
    both(lambda T: (err_of(bench(T).Timer().repeat), err_of(bench(T).Timer().autorange)))


def test_statement_errors_come_through():
    both(lambda T: err_of(bench(T).Timer("undefined_name", globals={}).timeit, 3))
