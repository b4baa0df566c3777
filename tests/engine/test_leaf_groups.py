"""LeafGroup (graph/hooks.py): a hook over several leaves, reported once their gradients
are all accumulated. DistributedDataParallel starts a bucket's all-reduce from it, so it
must fire mid-backward (before the rest of the graph has run), once per group, with the
gradients already in .grad, and cost the compiled sweep one hand-back per group."""
import numpy as np
import pytest

import jitgrad as torch
from jitgrad.engine import compiled
from jitgrad.graph.hooks import LeafGroup, leaf_hooks
from jitgrad.graph.tape import close_current_tape


def _mlp(dtype):
    torch.manual_seed(0)
    return [torch.nn.Linear(4, 8).to(dtype), torch.nn.Linear(8, 8).to(dtype), torch.nn.Linear(8, 3).to(dtype)]


def _loss(layers, x):
    h = x
    for i, lin in enumerate(layers):
        h = lin(h)
        if i + 1 < len(layers):
            h = h.tanh()
    return (h * h).sum()


def _grads(layers):
    return [p.grad._data.copy() for lin in layers for p in lin.parameters()]


@pytest.fixture
def groups():
    # a fresh tape: one that an earlier test left rows of another dtype on runs on the
    # Python engine, which reports each leaf on its own
    close_current_tape()
    made = []
    yield made
    for g in made:
        g.remove()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_each_group_fires_once_mid_backward_with_its_grads_accumulated(groups, dtype):
    layers = _mlp(dtype)
    x = torch.randn(5, 4, dtype=dtype)
    _loss(layers, x).backward()
    want = _grads(layers)
    for lin in layers:
        lin.zero_grad(set_to_none=True)
    seen = []

    def on_ready(i):
        def fn(tensors):
            # the group's members are accumulated; the layers before it are not yet
            assert all(t.grad is not None for t in tensors)
            seen.append((i, len(tensors), [p.grad is None for lin in layers[:i] for p in lin.parameters()]))
        return fn

    for i, lin in enumerate(layers):
        groups.append(LeafGroup(lin.parameters(), on_ready(i)))
    _loss(layers, x).backward()
    assert [(i, n) for i, n, _ in seen] == [(2, 2), (1, 2), (0, 2)]
    assert all(all(before) for _, _, before in seen)
    for got, w in zip(_grads(layers), want):
        np.testing.assert_array_equal(got, w)


def test_the_sweep_hands_back_once_per_group_not_per_leaf(groups, monkeypatch):
    layers = _mlp(torch.float64)
    x = torch.randn(5, 4, dtype=torch.float64)
    _loss(layers, x).backward()  # compiles what the graph needs
    sched = compiled.scheduler()
    calls = []
    sweep = sched.sweep

    def counting(*args):
        calls.append(1)
        return sweep(*args)

    monkeypatch.setattr(sched, "sweep", counting)
    groups.append(LeafGroup([p for lin in layers for p in lin.parameters()], lambda ts: None))
    _loss(layers, x).backward()
    assert len(calls) == 2  # one stop for the group, one call to finish
    groups.pop().remove()
    groups.append(LeafGroup(layers[0].parameters(), lambda ts: None))
    groups.append(LeafGroup(layers[2].parameters(), lambda ts: None))
    calls.clear()
    _loss(layers, x).backward()
    assert len(calls) == 3


def test_inactive_and_removed_groups_are_not_reported(groups):
    layers = _mlp(torch.float64)
    seen = []
    g = LeafGroup(layers[1].parameters(), seen.append)
    groups.append(g)
    before = leaf_hooks[0]
    g.active = False
    _loss(layers, torch.randn(2, 4, dtype=torch.float64)).backward()
    assert seen == []
    g.active = True
    g.remove()
    assert leaf_hooks[0] == before - 1
    _loss(layers, torch.randn(2, 4, dtype=torch.float64)).backward()
    assert seen == [] and layers[1].weight._leaf_group is None


def test_members_left_out_of_the_backward_are_not_reported(groups):
    a = torch.tensor([1.0, 2.0], requires_grad=True)
    b = torch.tensor([3.0], requires_grad=True)
    unused = torch.tensor([5.0], requires_grad=True)
    seen = []
    groups.append(LeafGroup([a, b, unused], lambda ts: seen.append(ts)))
    ((a * a).sum() * b).sum().backward()
    assert len(seen) == 1 and {id(t) for t in seen[0]} == {id(a), id(b)}
    assert unused.grad is None


def test_python_engine_reports_each_leaf(groups):
    # create_graph runs on the Python engine: there the group hears of each leaf in turn
    a = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    b = torch.tensor([3.0], dtype=torch.float64, requires_grad=True)
    seen = []
    groups.append(LeafGroup([a, b], lambda ts: seen.append(len(ts))))
    ((a * a).sum() * b).sum().backward(create_graph=True)
    assert seen == [1, 1]
    assert a.grad.tolist() == [6.0, 12.0] and b.grad.tolist() == [5.0]


def test_a_member_is_a_leaf_that_requires_grad_in_the_newest_group_that_took_it(groups):
    a = torch.tensor([1.0], requires_grad=True)
    b = torch.tensor([2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf tensors that require grad"):
        LeafGroup([a * 2], print)
    with pytest.raises(RuntimeError, match="leaf tensors that require grad"):
        LeafGroup([torch.tensor([1.0])], print)
    old, new = [], []
    groups.append(LeafGroup([a, b], old.append))
    groups.append(LeafGroup([a], new.append))
    (a * b).sum().backward()
    assert [[id(t) for t in ts] for ts in old] == [[id(b)]] and [[id(t) for t in ts] for ts in new] == [[id(a)]]
    groups[0].remove()  # leaves a alone: it is the newer group's
    assert a._leaf_group is groups[1] and b._leaf_group is None


def test_an_error_in_the_group_function_reaches_the_caller(groups):
    layers = _mlp(torch.float64)

    def boom(tensors):
        raise ValueError("from the group")

    groups.append(LeafGroup(layers[2].parameters(), boom))
    with pytest.raises(ValueError, match="from the group"):
        _loss(layers, torch.randn(2, 4, dtype=torch.float64)).backward()
    # the group's own members were accumulated before it ran; nothing else was
    assert layers[2].weight.grad is not None and layers[0].weight.grad is None
