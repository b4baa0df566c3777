"""no_grad / enable_grad / set_grad_enabled / inference_mode / is_grad_enabled."""
import pytest

import jitgrad


@pytest.fixture(autouse=True)
def _restore_grad_mode():
    assert jitgrad.is_grad_enabled() is True
    yield
    jitgrad.set_grad_enabled(True)


def test_default_enabled():
    assert jitgrad.is_grad_enabled() is True


def test_no_grad_context_records_nothing():
    x = jitgrad.tensor([1.0, 2.0], requires_grad=True)
    with jitgrad.no_grad():
        assert jitgrad.is_grad_enabled() is False
        y = x * 2
        z = (x.exp() @ x).sum()
        w = x.sin() + 1.0
    assert jitgrad.is_grad_enabled() is True
    for t in (y, z, w):
        assert t.requires_grad is False
        assert t.grad_fn is None
        assert t.is_leaf is True
    assert y.tolist() == [2.0, 4.0]
    # leaves created inside no_grad keep their flag
    with jitgrad.no_grad():
        leaf = jitgrad.ones(2, requires_grad=True)
    assert leaf.requires_grad is True
    # outside again, graphs are recorded
    assert (x * 2).grad_fn is not None


def test_no_grad_decorator_with_and_without_parens():
    x = jitgrad.tensor([1.0], requires_grad=True)

    @jitgrad.no_grad()
    def f(t):
        return t * 2, jitgrad.is_grad_enabled()

    @jitgrad.no_grad
    def g(t):
        return t * 3, jitgrad.is_grad_enabled()

    for fn in (f, g):
        out, enabled = fn(x)
        assert enabled is False
        assert out.requires_grad is False and out.grad_fn is None
        assert jitgrad.is_grad_enabled() is True
    assert f.__name__ == "f"


def test_enable_grad_inside_no_grad():
    x = jitgrad.tensor([1.0], requires_grad=True)
    with jitgrad.no_grad():
        with jitgrad.enable_grad():
            assert jitgrad.is_grad_enabled() is True
            y = x * 2
        assert jitgrad.is_grad_enabled() is False
        z = x * 2
    assert y.requires_grad is True and y.grad_fn is not None
    assert z.requires_grad is False

    @jitgrad.enable_grad()
    def h(t):
        return t * 2

    @jitgrad.enable_grad
    def h2(t):
        return t * 2

    with jitgrad.no_grad():
        a = h(x)
        b = h2(x)
        assert jitgrad.is_grad_enabled() is False
    assert a.requires_grad and b.requires_grad
    a.backward()
    assert x.grad.tolist() == [2.0]


def test_set_grad_enabled_context_and_function():
    x = jitgrad.tensor([1.0], requires_grad=True)
    with jitgrad.set_grad_enabled(False):
        assert jitgrad.is_grad_enabled() is False
        y = x * 2
    assert jitgrad.is_grad_enabled() is True
    assert y.requires_grad is False
    with jitgrad.set_grad_enabled(True):
        z = x * 2
    assert z.requires_grad is True
    with jitgrad.no_grad():
        with jitgrad.set_grad_enabled(True):
            assert jitgrad.is_grad_enabled() is True
        assert jitgrad.is_grad_enabled() is False
    # called as a plain function it switches the mode immediately
    jitgrad.set_grad_enabled(False)
    assert jitgrad.is_grad_enabled() is False
    assert (x * 2).requires_grad is False
    jitgrad.set_grad_enabled(True)
    assert jitgrad.is_grad_enabled() is True
    assert (x * 2).requires_grad is True


def test_set_grad_enabled_decorator():
    x = jitgrad.tensor([1.0], requires_grad=True)

    @jitgrad.set_grad_enabled(False)
    def f(t):
        return t * 2, jitgrad.is_grad_enabled()

    out, enabled = f(x)
    assert enabled is False and out.requires_grad is False
    assert jitgrad.is_grad_enabled() is True


def test_inference_mode():
    x = jitgrad.tensor([1.0], requires_grad=True)
    with jitgrad.inference_mode():
        assert jitgrad.is_grad_enabled() is False
        y = x * 2
    assert jitgrad.is_grad_enabled() is True
    assert y.requires_grad is False and y.grad_fn is None
    assert y.tolist() == [2.0]

    @jitgrad.inference_mode()
    def f(t):
        return t * 2

    @jitgrad.inference_mode
    def g(t):
        return t * 2

    assert f(x).requires_grad is False
    assert g(x).requires_grad is False
    with jitgrad.inference_mode(False):
        assert jitgrad.is_grad_enabled() is True
        assert (x * 2).requires_grad is True


def test_mode_restored_after_exception():
    with pytest.raises(ValueError):
        with jitgrad.no_grad():
            raise ValueError("boom")
    assert jitgrad.is_grad_enabled() is True

    @jitgrad.no_grad()
    def bad():
        raise KeyError("x")

    with pytest.raises(KeyError):
        bad()
    assert jitgrad.is_grad_enabled() is True
    with jitgrad.no_grad():
        with pytest.raises(ValueError):
            with jitgrad.enable_grad():
                raise ValueError
        assert jitgrad.is_grad_enabled() is False


def test_backward_inside_no_grad_still_works_for_existing_graph():
    x = jitgrad.tensor([3.0], requires_grad=True)
    y = x * x
    with jitgrad.no_grad():
        y.backward()
    assert x.grad.tolist() == [6.0]


def test_no_grad_update_pattern():
    x = jitgrad.tensor([1.0, 2.0], requires_grad=True)
    (x * x).sum().backward()
    with jitgrad.no_grad():
        new = x - 0.5 * x.grad
        x.copy_(new)
    assert x.tolist() == [0.0, 0.0]
    assert x.is_leaf and x.requires_grad and x.grad_fn is None
