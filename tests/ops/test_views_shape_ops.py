"""narrow, select, split, split_with_sizes, chunk, unbind, diagonal and repeat against
PyTorch 2.13 in float64: values, gradients, node names, views sharing their input's
storage (writes through the base show in the view and back), and the errors."""
import numpy as np
import pytest
import torch
from conftest import both, err_of, grad_fn_name

import jitgrad

DATA = np.arange(1.0, 61.0).reshape(3, 4, 5) / 7.0

# name -> the op on a (3, 4, 5) tensor; a tuple result is flattened
OPS = {
    "narrow": lambda T, a: a.narrow(1, 1, 2),
    "narrow_neg": lambda T, a: T.narrow(a, -1, -3, 3),
    "narrow_empty": lambda T, a: a.narrow(2, 5, 0),
    "narrow_tensor_start": lambda T, a: a.narrow(0, T.tensor(1), 2),
    "select": lambda T, a: a.select(1, 2),
    "select_neg": lambda T, a: T.select(a, -1, -5),
    "split": lambda T, a: a.split(2, 2),
    "split_dim0": lambda T, a: T.split(a, 2),
    "split_big": lambda T, a: a.split(10, 1),
    "split_sizes": lambda T, a: a.split([1, 0, 3], 1),
    "split_with_sizes": lambda T, a: T.split_with_sizes(a, [3, 2], -1),
    "chunk": lambda T, a: a.chunk(3, 2),
    "chunk_more_than_size": lambda T, a: T.chunk(a, 6, 0),
    "chunk_uneven": lambda T, a: a.chunk(4, -1),
    "unbind": lambda T, a: a.unbind(1),
    "unbind_default": lambda T, a: T.unbind(a),
    "diagonal": lambda T, a: a.diagonal(),
    "diagonal_offset": lambda T, a: T.diagonal(a, 1, 1, 2),
    "diagonal_neg_offset": lambda T, a: a.diagonal(-2, 2, 1),
    "diagonal_swapped": lambda T, a: a.diagonal(2, -1, 0),
    "diagonal_empty": lambda T, a: a.diagonal(9),
    "repeat": lambda T, a: a.repeat(2, 1, 3),
    "repeat_new_dims": lambda T, a: a.repeat(2, 1, 1, 2),
    "repeat_zero": lambda T, a: a.repeat(1, 0, 1),
    "repeat_list": lambda T, a: a.repeat([1, 2, 1]),
}


def _outs(r):
    return list(r) if isinstance(r, tuple) else [r]


@pytest.mark.parametrize("name", sorted(OPS))
def test_values_gradients_and_node_names_match_torch(name):
    def run(T):
        x = T.tensor(DATA, dtype=T.float64, requires_grad=True)
        outs = _outs(OPS[name](T, x * 1.0))
        w = np.random.default_rng(len(name))
        loss = sum((o * T.tensor(w.standard_normal(tuple(o.shape)), dtype=T.float64)).sum() for o in outs)
        grad, = T.autograd.grad(loss, x)
        return [o.detach() for o in outs], grad, [grad_fn_name(o) for o in outs], \
            [tuple(o.shape) for o in outs], isinstance(OPS[name](T, x), tuple)
    both(run)


@pytest.mark.parametrize("name", sorted(OPS))
def test_results_without_grad_match_torch(name):
    both(lambda T: [o for o in _outs(OPS[name](T, T.tensor(DATA, dtype=T.float64)))])


VIEWS = sorted(n for n in OPS if not n.startswith("repeat"))


@pytest.mark.parametrize("name", VIEWS)
def test_views_share_the_input_storage(name):
    """A write into the base shows in the view and a write into the view shows in the base."""
    def run(T):
        x = T.tensor(DATA, dtype=T.float64)
        outs = _outs(OPS[name](T, x))
        x.mul_(2.0)                  # through the base
        seen = [o.clone() for o in outs]
        for o in outs:
            o.add_(1.0)              # through each view (overlapping writes add up)
        return seen, x
    both(run)


def test_repeat_is_a_copy():
    def run(T):
        x = T.tensor(DATA, dtype=T.float64)
        r = x.repeat(1, 2, 1)
        x.zero_()
        return r
    both(run)


@pytest.mark.parametrize("name", [n for n in VIEWS if not n.startswith(("split", "chunk", "unbind"))])
def test_in_place_on_a_view_with_history_reaches_the_base(name):
    """An in-place op on the view of a non-leaf: the base's gradient counts it (CopySlices).
    (torch forbids it on the pieces of split / chunk / unbind.)"""
    def run(T):
        x = T.tensor(DATA, dtype=T.float64, requires_grad=True)
        base = x * 1.0
        outs = _outs(OPS[name](T, base))
        for o in outs:
            o.mul_(3.0)
        grad, = T.autograd.grad((base * base).sum(), x)
        return base.detach(), grad
    both(run)


def test_grad_of_one_piece_of_a_split_leaves_zeros_elsewhere():
    def run(T):
        x = T.tensor(DATA, dtype=T.float64, requires_grad=True)
        a, b = x.split([1, 3], 1)
        (b ** 2).sum().backward()
        return x.grad
    both(run)


def test_double_backward_through_views():
    def run(T):
        x = T.tensor(DATA, dtype=T.float64, requires_grad=True)
        y = (x.diagonal(0, 1, 2) ** 3).sum() + (x.narrow(2, 1, 2).select(0, 1) ** 2).sum() + \
            (x.repeat(2, 1, 1) ** 2).sum()
        g, = T.autograd.grad(y, x, create_graph=True)
        gg, = T.autograd.grad((g * g).sum(), x)
        return g, gg
    both(run)


# gradgradcheck's check of its generated grad_outputs refuses an empty one (stride 0)
EMPTY = {"narrow_empty", "diagonal_empty", "repeat_zero", "split_sizes"}


def test_gradcheck_and_gradgradcheck():
    x = jitgrad.tensor(DATA, dtype=jitgrad.float64, requires_grad=True)
    for name in sorted(OPS):
        fn = OPS[name]
        if name == "narrow_tensor_start" or name in EMPTY:
            continue  # the start is an int tensor, not an input of the check

        def f(t, fn=fn):
            return tuple(_outs(fn(jitgrad, t)))
        assert jitgrad.autograd.gradcheck(f, (x,)), name
        assert jitgrad.autograd.gradgradcheck(f, (x,)), name


def test_forward_ad_tangent_is_the_same_view():
    def run(T):
        import importlib
        fwAD = importlib.import_module(T.__name__ + ".autograd.forward_ad")
        x = T.tensor(DATA, dtype=T.float64)
        t = T.tensor(DATA[::-1].copy(), dtype=T.float64)
        with fwAD.dual_level():
            d = fwAD.make_dual(x, t)
            outs = [*d.split(2, 2), d.diagonal(1), d.narrow(0, 1, 1), *d.unbind(1), d.repeat(1, 2, 1)]
            return [fwAD.unpack_dual(o).tangent for o in outs]
    both(run)


def test_int_and_bool_tensors():
    def run(T):
        i = T.tensor(np.arange(24).reshape(4, 6))
        b = i > 10
        return [*i.split(4, 1), i.diagonal(), i.repeat(2, 1), *b.chunk(2), b.narrow(1, 2, 3), i.select(0, -1)]
    both(run)


def test_non_contiguous_input():
    def run(T):
        x = T.tensor(DATA, dtype=T.float64, requires_grad=True)
        p = x.permute(2, 0, 1)
        outs = [*p.split(2, 1), p.diagonal(0, 0, 2), p.narrow(2, 1, 3), p.select(1, 2), p.repeat(1, 2, 1)]
        g, = T.autograd.grad(sum((o * o).sum() for o in outs), x)
        return [o.detach() for o in outs], g
    both(run)


def test_multi_output_views_are_pieces_of_one_tuple():
    def run(T):
        x = T.tensor(DATA, dtype=T.float64, requires_grad=True) * 1.0
        return [grad_fn_name(o) for o in (*x.split(2), *x.split([1, 2]), *x.chunk(2), *x.unbind())]
    both(run)


ERRORS = {
    "narrow_past_end": lambda T, a: a.narrow(2, 4, 2),
    "narrow_bad_dim": lambda T, a: a.narrow(3, 0, 1),
    "narrow_start_range": lambda T, a: a.narrow(1, -5, 1),
    "narrow_negative_length": lambda T, a: a.narrow(1, 0, -1),
    "narrow_0d": lambda T, a: T.tensor(1.0).narrow(0, 0, 1),
    "select_range": lambda T, a: a.select(1, 4),
    "select_range_neg": lambda T, a: a.select(-1, -6),
    "select_bad_dim": lambda T, a: a.select(3, 0),
    "select_0d": lambda T, a: T.tensor(1.0).select(0, 0),
    "chunk_zero": lambda T, a: a.chunk(0),
    "chunk_0d": lambda T, a: T.tensor(1.0).chunk(2),
    "split_zero": lambda T, a: a.split(0),
    "split_negative": lambda T, a: a.split(-1),
    "split_sizes_sum": lambda T, a: a.split([1, 2], 1),
    "split_sizes_negative": lambda T, a: a.split([5, -1], 1),
    "split_sizes_float": lambda T, a: T.split_with_sizes(a, [1.0, 2.0], 0),
    "unbind_0d": lambda T, a: T.tensor(1.0).unbind(),
    "unbind_bad_dim": lambda T, a: a.unbind(3),
    "diagonal_same_dims": lambda T, a: a.diagonal(0, 1, 1),
    "diagonal_1d": lambda T, a: T.ones(3).diagonal(),
    "diagonal_1d_same_dims": lambda T, a: T.ones(3).diagonal(0, -1, 0),
    "diagonal_0d": lambda T, a: T.tensor(1.0).diagonal(0, 0, -1),
    "diagonal_bad_dim": lambda T, a: a.diagonal(0, 0, 3),
    "repeat_too_few": lambda T, a: a.repeat(2, 2),
    "repeat_negative": lambda T, a: a.repeat(1, -1, 2),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_errors_match_torch(name):
    j = err_of(ERRORS[name], jitgrad, jitgrad.tensor(DATA))
    t = err_of(ERRORS[name], torch, torch.tensor(DATA))
    assert t is not None and j is not None, (j, t)
    assert j[0] == t[0] and j[1] == t[1], (j, t)


@pytest.mark.parametrize("name", [n for n in VIEWS if not n.startswith(("split", "chunk", "unbind"))])
def test_in_place_with_grad_on_a_view_of_a_tensor_without_grad(name):
    """The view of a plain tensor written with a value that requires grad: the base gets
    the history (its gradient flows to the value)."""
    def run(T):
        x = T.tensor(DATA, dtype=T.float64)
        outs = _outs(OPS[name](T, x))
        w = T.tensor(2.5, dtype=T.float64, requires_grad=True)
        for o in outs:
            o.mul_(w)
        g, = T.autograd.grad((x * x).sum(), w)
        return x.detach(), x.requires_grad, g
    both(run)


@pytest.mark.parametrize("piece", [lambda x: x.split(2, 1)[1], lambda x: x.chunk(2)[0], lambda x: x.unbind(2)[3],
                                   lambda x: x.split([1, 3], 1)[1], lambda x: jitgrad.split(x, [2, 1])[1]
                                   if isinstance(x, jitgrad.Tensor) else torch.split(x, [2, 1])[1]],
                         ids=["split", "chunk", "unbind", "split_sizes", "split_with_sizes"])
def test_in_place_on_a_multi_output_view_is_refused(piece):
    def f(T):
        x = T.tensor(DATA, dtype=T.float64, requires_grad=True) * 1.0
        piece(x).mul_(2.0)
    j, t = err_of(f, jitgrad), err_of(f, torch)
    assert t is not None and j == t, (j, t)
