"""vmap: torch.func.vmap on jitgrad.

vmap(f)(x) runs f once on BatchedTensors (_batched.py) whose physical tensors carry the
batch in a leading dim; every op f calls runs its batching rule (_rules.py), reached
through the dispatchers _dispatch.py swaps in while a level is active. in_dims / out_dims
are pytrees as torch's (tuples, lists and dicts of ints or None), levels nest, chunk_size
runs the batch in pieces, and randomness says what a random op does per sample.
"""
import functools

from jitgrad.func import _dispatch, _rules
from jitgrad.func._batched import LEVELS, BatchedTensor, is_batched, physical, pop_level, push_level, wrap
from jitgrad.graph.tensor import Tensor, _wrap_dim, rng_state, set_rng_state
from jitgrad.ops import functional as F


# --- pytrees: tuples, lists and dicts --------------------------------------------------------------
class TreeSpec:
    __slots__ = ("kind", "keys", "children", "make")

    def __init__(self, kind, keys=None, children=(), make=None):
        self.kind, self.keys, self.children, self.make = kind, keys, list(children), make

    @property
    def num_leaves(self):
        return 1 if self.kind is None else sum(c.num_leaves for c in self.children)

    def __repr__(self):
        if self.kind is None:
            return "*"
        keys = None if self.keys is None else list(self.keys)
        return f"TreeSpec({self.kind}, {keys}, [{', '.join(map(repr, self.children))}])"


def _node(x):
    """(kind, keys, children, make) of a container, None for a leaf."""
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x).__name__, None, list(x), lambda items, t=type(x): t(*items)
    if type(x) is tuple:
        return "tuple", None, list(x), tuple
    if type(x) is list:
        return "list", None, list(x), list
    if type(x) is dict:
        keys = list(x)
        return "dict", keys, [x[k] for k in keys], lambda items, k=keys: dict(zip(k, items))
    return None


def tree_flatten(x):
    node = _node(x)
    if node is None:
        return [x], TreeSpec(None)
    kind, keys, children, make = node
    leaves, specs = [], []
    for c in children:
        sub, spec = tree_flatten(c)
        leaves += sub
        specs.append(spec)
    return leaves, TreeSpec(kind, keys, specs, make)


def tree_unflatten(leaves, spec):
    it = iter(leaves)

    def build(s):
        if s.kind is None:
            return next(it)
        return s.make([build(c) for c in s.children])
    return build(spec)


def broadcast_to_and_flatten(tree, spec):
    """tree as a prefix of spec, one value per leaf of spec (a leaf of tree covers a whole
    subtree); None when the structures differ."""
    node = _node(tree)
    if node is None:
        return [tree] * spec.num_leaves
    kind, keys, children, _ = node
    if kind != spec.kind or keys != spec.keys or len(children) != len(spec.children):
        return None
    out = []
    for c, s in zip(children, spec.children):
        sub = broadcast_to_and_flatten(c, s)
        if sub is None:
            return None
        out += sub
    return out


# --- the API ---------------------------------------------------------------------------------------
def _name(func):
    if isinstance(func, functools.partial):
        return f"functools.partial({_name(func.func)}, ...)"
    return getattr(func, "__name__", repr(func))


def vmap(func, in_dims=0, out_dims=0, randomness="error", *, chunk_size=None):
    """Vectorize func over dim in_dims of its inputs: func sees one sample at a time; the
    outputs gain the batch dim at out_dims. As torch.func.vmap."""
    if randomness not in ("error", "different", "same"):
        raise RuntimeError(f"Only allowed values for randomness are 'error', 'different', or 'same'. Got {randomness}")
    if not (chunk_size is None or chunk_size > 0):
        raise ValueError(f"vmap: chunk_size should be None or greater than 0. (got {chunk_size})")

    @functools.wraps(func)
    def wrapped(*args, **kwargs):
        _check_out_dims(out_dims, func)
        size, flat_in_dims, flat_args, spec = _batched_inputs(in_dims, args, func)
        if chunk_size is None:
            return _flat_vmap(func, size, flat_in_dims, flat_args, spec, out_dims, randomness, kwargs)
        return _chunked_vmap(func, size, chunk_size, flat_in_dims, flat_args, spec, out_dims, randomness, kwargs)
    return wrapped


def _check_out_dims(out_dims, func):
    if isinstance(out_dims, int):
        return
    for d in tree_flatten(out_dims)[0]:
        if d is not None and not isinstance(d, int):
            raise ValueError(f"vmap({_name(func)}, ..., out_dims={out_dims}): `out_dims` must be an int, None or a "
                             "python collection of ints representing where in the outputs the vmapped dimension "
                             "should appear.")


def _is_tensor(x):
    return isinstance(x, Tensor) or is_batched(x)


def _batched_inputs(in_dims, args, func):
    head = f"vmap({_name(func)}, in_dims={in_dims}, ...)(<inputs>): "
    if not isinstance(in_dims, (int, tuple)):
        raise ValueError(head + "expected `in_dims` to be int or a (potentially nested) tuple matching the "
                         f"structure of inputs, got: {type(in_dims)}.")
    if not args:
        raise ValueError(f"vmap({_name(func)})(<inputs>): got no inputs. Maybe you forgot to add inputs, or you are "
                         "trying to vmap over a function with no inputs. The latter is unsupported.")
    flat_args, spec = tree_flatten(args)
    flat_in_dims = broadcast_to_and_flatten(in_dims, spec)
    if flat_in_dims is None:
        raise ValueError(head + f"in_dims is not compatible with the structure of `inputs`. in_dims has structure "
                         f"{tree_flatten(in_dims)[1]} but inputs has structure {spec}.")
    for i, (arg, d) in enumerate(zip(flat_args, flat_in_dims)):
        if d is not None and not isinstance(d, int):
            raise ValueError(head + f"Got in_dim={d} for an input but in_dim must be either an integer dimension "
                             "or None.")
        if isinstance(d, int) and not _is_tensor(arg):
            raise ValueError(head + f"Got in_dim={d} for an input but the input is of type {type(arg)}. We cannot "
                             "vmap over non-Tensor arguments, please use None as the respective in_dim")
        if d is not None and not -arg.dim() <= d < arg.dim():
            raise ValueError(head + f"Got in_dim={d} for some input, but that input is a Tensor of dimensionality "
                             f"{arg.dim()} so expected in_dim to satisfy -{arg.dim()} <= in_dim < {arg.dim()}.")
        if d is not None and d < 0:
            flat_in_dims[i] = d % arg.dim()
    return _batch_size(flat_in_dims, flat_args), flat_in_dims, flat_args, spec


def _batch_size(flat_in_dims, flat_args):
    sizes = [arg.size(d) for d, arg in zip(flat_in_dims, flat_args) if d is not None]
    if not sizes:
        raise ValueError("vmap: Expected at least one Tensor to vmap over")
    if any(s != sizes[0] for s in sizes):
        raise ValueError(f"vmap: Expected all tensors to have the same size in the mapped dimension, got sizes "
                         f"{sizes} for the mapped dimension")
    return sizes[0]


def _movedim(p, src, dst):
    if src == dst:
        return p
    order = list(range(p.ndim))
    order.insert(dst, order.pop(src))
    return p.permute(tuple(order))


def _add_batch_dim(x, dim, level):
    """x batched over `level` (the innermost) along its logical dim `dim`."""
    if is_batched(x):
        nb = len(x._levels)
        return BatchedTensor(_movedim(x._phys, nb + dim, nb), x._levels + (level,))
    return BatchedTensor(_movedim(x, dim, 0), (level,))


def _remove_batch_dim(y, level, size, out_dim):
    """y without `level`: its batch dim moved to logical dim out_dim (expanded there when y
    does not depend on the level)."""
    levels = y._levels if is_batched(y) else ()
    p = physical(y)
    rank = p.ndim - len(levels)
    if level in levels:
        rest = tuple(lvl for lvl in levels if lvl != level)
        od = _wrap_dim(out_dim, rank + 1)
        return wrap(_movedim(p, levels.index(level), len(rest) + od), rest)
    od = _wrap_dim(out_dim, rank + 1)
    p = p.unsqueeze(len(levels) + od)
    shape = list(p.shape)
    shape[len(levels) + od] = size
    return wrap(p.expand(tuple(shape)), levels)


def _flat_vmap(func, size, flat_in_dims, flat_args, spec, out_dims, randomness, kwargs):
    outermost = not LEVELS
    lvl = push_level(size, randomness)
    if outermost:
        _dispatch.install()
    try:
        batched = [a if d is None else _add_batch_dim(a, d, lvl.id) for a, d in zip(flat_args, flat_in_dims)]
        out = _dispatch.dispatched(func)(*tree_unflatten(batched, spec), **kwargs)
        return _unwrap(out, out_dims, lvl.id, size, func)
    finally:
        pop_level(lvl)
        if outermost:
            _dispatch.uninstall()


def _unwrap(outputs, out_dims, level, size, func):
    flat, spec = tree_flatten(outputs)

    def incompatible():
        return ValueError(f"vmap({_name(func)}, ..., out_dims={out_dims})(<inputs>): out_dims is not compatible with "
                          f"the structure of `outputs`. out_dims has structure {tree_flatten(out_dims)[1]} but "
                          f"outputs has structure {spec}.")
    if spec.kind is None:
        if isinstance(out_dims, int) or out_dims is None:
            flat_dims = [out_dims]
        elif isinstance(out_dims, tuple) and len(out_dims) == 1:
            flat_dims = list(out_dims)
        else:
            raise incompatible()
    else:
        flat_dims = broadcast_to_and_flatten(out_dims, spec)
        if flat_dims is None:
            raise incompatible()
    name = _name(func)
    result = []
    for y, d in zip(flat, flat_dims):
        if d is None:
            if is_batched(y) and level in y._levels:
                raise ValueError(f"vmap({name}, ...): `{name}` can not return a BatchedTensor when out_dim is None")
            result.append(y)
            continue
        if not _is_tensor(y):
            raise ValueError(f"vmap({name}, ...): `{name}` must only return Tensors, got type {type(y)}. Did you "
                             "mean to set out_dims= to None for output?")
        result.append(_remove_batch_dim(y, level, size, d))
    return tree_unflatten(result, spec)


# --- chunk_size ------------------------------------------------------------------------------------
def _narrow(x, dim, start, stop):
    return x[(slice(None),) * dim + (slice(start, stop),)]


def _cat(chunks, dim):
    if any(is_batched(c) for c in chunks):
        return _rules.call("cat", F.cat, (list(chunks), dim), {})
    return F.cat(list(chunks), dim)


def _chunked_vmap(func, size, chunk_size, flat_in_dims, flat_args, spec, out_dims, randomness, kwargs):
    state = rng_state() if randomness == "same" else None
    chunks = []
    for start in range(0, size, chunk_size):
        stop = min(start + chunk_size, size)
        args = [a if d is None else _narrow(a, d, start, stop) for a, d in zip(flat_args, flat_in_dims)]
        if state is not None:
            set_rng_state(state)
        chunks.append(_flat_vmap(func, stop - start, flat_in_dims, args, spec, out_dims, randomness, kwargs))
    flats = [tree_flatten(c)[0] for c in chunks]
    out_spec = tree_flatten(chunks[0])[1]
    dims = [out_dims] if out_spec.kind is None and not isinstance(out_dims, tuple) else \
        list(out_dims) if out_spec.kind is None else broadcast_to_and_flatten(out_dims, out_spec)
    joined = [parts[0] if d is None else _cat(parts, d) for parts, d in zip(zip(*flats), dims)]
    return tree_unflatten(joined, out_spec)
