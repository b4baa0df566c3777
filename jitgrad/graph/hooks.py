"""Hooks: Python the user asked to run during backward. This module keeps the registries;
engine/hooks.py runs them.

Hooks on non-leaf tensors and on nodes live in their tape, keyed by row (node objects
are made on demand and come and go): a tensor's hooks by its own row, a node's pre-hooks
and post-hooks by the node's row. The compiled sweep stops at such rows (PRE: status 4,
the hooks see and may replace the complete gradient, then the row runs; a node with
post-hooks runs in Python, status 3, so its input gradients exist separately). Hooks on
leaves run where the leaf's gradient is accumulated.

A LeafGroup is a hook over several leaves, for code that acts once a set of gradients is
complete (DistributedDataParallel's buckets): the compiled sweep counts the group's
pending gradients as one and hands back to Python once, when the last member it reaches
is accumulated, rather than once per leaf.
"""
import itertools
import threading

from jitgrad._core.capture import generation

_ids = itertools.count()
# how many hooks on leaves (tensor, post-accumulate, AccumulateGrad) exist: while none do,
# backward skips every per-leaf hook check. Changed only under _lock: `+= 1` is a read and
# a write, and a count lost to another thread registering at once could reach 0 while
# hooks exist, and backward would skip them
leaf_hooks = [0]
_lock = threading.Lock()


def _count_leaf_hooks(delta):
    with _lock:
        leaf_hooks[0] += delta


class RemovableHandle:
    """Returned by register_*hook; `remove()` unregisters the hook."""

    def __init__(self, registry, key, on_leaf=False, watched=False):
        self._registry = registry
        self._key = key
        self._on_leaf = on_leaf
        self._watched = watched
        self.id = key[1]

    def remove(self):
        with _lock:  # (two threads removing one handle: one of them does)
            hooks = self._registry.get(self._key[0])
            if hooks is None or self.id not in hooks:
                return
            del hooks[self.id]
            if self._on_leaf:
                leaf_hooks[0] -= 1
            if self._watched:
                generation[0] += 1
            if not hooks:
                del self._registry[self._key[0]]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


def add_hook(registry, where, fn, on_leaf=False, watched=False):
    """registry: a dict where -> {hook id: fn} (dicts keep registration order). watched: a
    module's hooks, which compiled plans guard (adding or removing one bumps the generation)."""
    hid = next(_ids)
    with _lock:  # (remove() may be deleting this registry's last entry for `where` now)
        registry.setdefault(where, {})[hid] = fn
        if on_leaf:
            leaf_hooks[0] += 1
    if watched:
        generation[0] += 1
    return RemovableHandle(registry, (where, hid), on_leaf, watched)


class LeafGroup:
    """Leaves whose accumulated gradients are reported together: `fn(tensors)` is called
    after their .grad is updated, with the members that got a gradient. The compiled
    engine calls it once per tape it sweeps (with every member that tape reaches, once the
    last of them is accumulated); the Python engine once per leaf. So fn may see a member
    more than once per backward only if the member is reached in several tapes, and fn
    must count what it sees. `active` False makes backward ignore the group (as if it had
    no hook), at no cost per leaf."""

    def __init__(self, tensors, fn):
        self.tensors = list(tensors)
        self.fn = fn
        self.active = True
        for t in self.tensors:
            if not t.requires_grad or t.grad_fn is not None:
                raise RuntimeError("a leaf group takes leaf tensors that require grad")
        # a tensor belongs to one group, the newest that takes it (a module wrapped in DDP
        # again: the new wrapper reduces its gradients, the old one no longer hears of them)
        for t in self.tensors:
            t._leaf_group = self
        _count_leaf_hooks(1)
        self.removed = False

    def remove(self):
        if not self.removed:
            for t in self.tensors:
                if t._leaf_group is self:
                    t._leaf_group = None
            self.tensors = []
            self.removed = True
            _count_leaf_hooks(-1)
