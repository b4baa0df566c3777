"""Grad-mode decorators as PyTorch 2.13 applies them: on a generator the mode holds inside
each step and the caller's own mode between steps (send, throw and close included); a
decorated class warns and becomes a function. Each test runs on jitgrad and on torch."""
import warnings

import pytest
from conftest import LIBS

pytest.importorskip("torch")


def modes(T):
    # factories: set_grad_enabled switches the mode when it is made
    return [(T.no_grad, False), (T.enable_grad, True), (lambda: T.set_grad_enabled(False), False),
            (T.inference_mode, False)]


@LIBS
@pytest.mark.parametrize("k", range(4))
def test_a_decorated_generator_holds_the_mode_in_each_step_only(T, k):
    make, inside = modes(T)[k]
    outside = not inside

    @make()
    def gen(n):
        for i in range(n):
            got = yield (i, T.is_grad_enabled())
            assert T.is_grad_enabled() == inside
            assert got == i * 10
        return "done"

    with T.set_grad_enabled(outside):
        g = gen(3)
        i, enabled = next(g)
        steps = [enabled]
        assert T.is_grad_enabled() == outside
        while True:
            try:
                i, enabled = g.send(i * 10)
            except StopIteration as stop:
                assert stop.value == "done"
                break
            steps.append(enabled)
            assert T.is_grad_enabled() == outside
    assert steps == [inside] * 3


@LIBS
def test_a_bare_no_grad_decorator_on_a_generator(T):
    @T.no_grad
    def gen():
        yield T.is_grad_enabled()
        yield T.is_grad_enabled()

    assert list(gen()) == [False, False]
    assert T.is_grad_enabled()


@LIBS
def test_an_exception_thrown_in_is_handled_inside_the_mode(T):
    @T.no_grad()
    def gen():
        while True:
            try:
                yield "value"
            except ValueError:
                yield ("handled", T.is_grad_enabled())

    g = gen()
    next(g)
    assert g.throw(ValueError("x")) == ("handled", False)
    assert T.is_grad_enabled()
    with pytest.raises(KeyError):
        g.throw(KeyError("not handled"))  # propagates out, and the mode is the caller's again
    assert T.is_grad_enabled()


@LIBS
def test_close_runs_the_generator_s_cleanup_inside_the_mode(T):
    seen = []

    @T.no_grad()
    def gen():
        try:
            yield 1
        finally:
            seen.append(T.is_grad_enabled())

    g = gen()
    next(g)
    g.close()
    assert seen == [False] and T.is_grad_enabled()


@LIBS
def test_a_tensor_made_inside_a_no_grad_generator_has_no_graph(T):
    x = T.ones(2, requires_grad=True)

    @T.no_grad()
    def scaled():
        for k in range(2):
            yield x * k

    ys = list(scaled())
    assert all(not y.requires_grad for y in ys)
    assert (x * 3).requires_grad  # the caller's mode is untouched


@LIBS
def test_decorating_a_class_warns_and_gives_a_function(T):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")

        @T.no_grad()
        class Made:
            def __init__(self):
                self.enabled = T.is_grad_enabled()

    assert len(w) == 1 and w[0].category is FutureWarning
    assert str(w[0].message).startswith("Decorating classes is deprecated and will be disabled in future versions.")
    assert not isinstance(Made, type)
    assert Made().enabled is False  # the constructor runs in the mode


@LIBS
def test_a_plain_function_still_gets_the_mode_and_keeps_its_name(T):
    @T.enable_grad()
    def f():
        """doc"""
        return T.is_grad_enabled()

    with T.no_grad():
        assert f() is True
    assert f.__name__ == "f" and f.__doc__ == "doc"
