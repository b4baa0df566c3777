"""torch.func's autodiff transforms: grad, grad_and_value, vjp, jacrev (reverse mode, on
jitgrad's autograd) and jvp, jacfwd, hessian (forward mode, on autograd.forward_ad).

torch tells its transforms apart by levels of wrapper tensors. Here a transform works on
the ordinary graph instead:

- The differentiated inputs are fresh tensors of the transform's own: a detached copy
  made to require grad when the argument is a plain tensor, or a differentiable clone
  when it carries a graph or a tangent from outside (so an enclosing transform can still
  differentiate through this one). The user's tensors are never modified.
- The backward runs with create_graph=True only when something outside the transform can
  differentiate the result: an enclosing transform, a dual level, or a leaf that requires
  grad other than the transform's own inputs reached by the function's graph (a captured
  parameter, say). Otherwise the compiled backward runs and the results are plain tensors,
  as torch's are once unwrapped at the outermost level.
"""
import functools
import threading

import numpy as np

from jitgrad._core.forward import state as _fw_state
from jitgrad._core.modes import enable_grad, is_grad_enabled
from jitgrad.autograd import forward_ad as fwAD
from jitgrad.engine.run import grad as _autograd_grad_fn
from jitgrad.func import _dispatch
from jitgrad.func._batched import (
    active_levels,
    align,
    batched_leaf_like,
    is_batched,
    level_size,
    physical,
    transform_leaf,
    wrap,
)
from jitgrad.func._pytree import tree_flatten, tree_map, tree_unflatten, treespec_pprint
from jitgrad.func.vmap import vmap as _vmap
from jitgrad.graph.spec import OP_ACC, OP_EXT
from jitgrad.graph.tensor import Tensor
from jitgrad.ops import functional as F


class _Depth(threading.local):
    depth = 0  # transforms of this module running in this thread


_active = _Depth()


class _Level:
    """One running transform: transforms called inside it see that they are nested."""

    def __enter__(self):
        _active.depth += 1

    def __exit__(self, *exc):
        _active.depth -= 1


# --- arguments --------------------------------------------------------------------------

def _check_argnum(argnum, num_args):
    if not isinstance(argnum, int):
        raise RuntimeError(f"argnum must be int, got: {type(argnum)}")
    if 0 <= argnum < num_args:
        return argnum
    if -num_args <= argnum < 0:
        return argnum + num_args
    raise RuntimeError(f"Got argnum={argnum}, but only {num_args} positional inputs")


def _normalize_argnums(argnums, num_args):
    if isinstance(argnums, int):
        return _check_argnum(argnums, num_args)
    if not isinstance(argnums, tuple):
        raise RuntimeError(f"argnums must be int or Tuple[int, ...], got: {type(argnums)}")
    wrapped = tuple(_check_argnum(a, num_args) for a in argnums)
    if len(wrapped) == 0:
        raise RuntimeError("argnums must be non-empty")
    if len(set(wrapped)) != len(wrapped):
        raise RuntimeError(f"argnums elements must be unique, got {argnums}")
    return wrapped


def _slice_argnums(args, argnums, as_tuple):
    """(argnums wrapped, the differentiated arguments): one argument for an int argnums
    unless as_tuple, a tuple of them for a tuple."""
    argnums = _normalize_argnums(argnums, len(args))
    if isinstance(argnums, int):
        return argnums, (args[argnums],) if as_tuple else args[argnums]
    return argnums, tuple(args[i] for i in argnums)


def _replace_args(args, argnums, new):
    """args with the differentiated ones (as _slice_argnums(as_tuple=False) gave them) replaced."""
    if isinstance(argnums, int):
        return tuple(new if i == argnums else a for i, a in enumerate(args))
    return tuple(new[argnums.index(i)] if i in argnums else a for i, a in enumerate(args))


def _is_tensor(x):
    return isinstance(x, Tensor) or is_batched(x)


def _differentiable(x):
    """The transform's own input for argument x (see the module doc). Under vmap it is
    physically batched over every active level, so that one backward of the batched
    output gives each sample's gradient in its own rows (_batched.batched_leaf_like)."""
    if not _is_tensor(x):
        raise ValueError(f"Thing passed to transform API must be Tensor, got {type(x)}")
    if active_levels():
        return batched_leaf_like(x)
    if x.requires_grad or _tangent(x) is not None:
        c = x.clone()  # differentiable in both modes: the enclosing transform sees through it
        return c if c.requires_grad else c.requires_grad_()
    return transform_leaf(x.detach().requires_grad_())


def _user(func):
    """The function to call: under vmap, an op captured before vmap started (jacfwd(torch.sin))
    is called through its dispatcher, as vmap does for its own function."""
    return _dispatch.dispatched(func) if active_levels() else func


def _dual_level_open():
    return _fw_state.level >= 0


def _tangent(x):
    return fwAD.unpack_dual(x).tangent if _dual_level_open() else None


# --- what a transform's results must stay differentiable for ------------------------------

def _reaches_foreign_leaf(outputs, own):
    """Whether the graph of `outputs` reaches a leaf that requires grad other than `own`
    (ids of the transform's inputs): a captured parameter, or an argument that is not
    differentiated but requires grad."""
    seen = set()
    todo = [(p._tape, p._row) for p in map(physical, outputs) if p._tape is not None]
    while todo:
        tape, row = todo.pop()
        key = (tape.id, row)
        if key in seen:
            continue
        seen.add(key)
        op = tape.op(row)
        if op == OP_ACC:
            leaf = tape.leaves[row].variable
            # a leaf another transform made for its inputs belongs to that transform: once
            # it has returned, nothing outside can differentiate with respect to it (torch's
            # levels); at depth 0 any such transform has returned
            if id(leaf) not in own and not getattr(leaf, "_func_leaf", False):
                return True
        elif op == OP_EXT:
            todo.append(tape.ext[row])
        else:
            for j in range(tape.n_inputs(row)):
                target = tape.edge_target(row, j)
                if target >= 0:
                    todo.append((tape, target))
    return False


def _keeps_graph(outputs, own, depth):
    """Whether the results of a transform entered at nesting `depth` must stay differentiable:
    inside another transform or a dual level, or when its graph reaches the outside."""
    return depth > 0 or _dual_level_open() or _reaches_foreign_leaf(outputs, own)


def _unwrap(tree, keep):
    """torch's unwrapping of results (and aux) at the transform's exit: tensors lose the
    transform's graph unless something outside needs it; anything else is refused, as torch."""
    def unwrap(x):
        if not _is_tensor(x):
            raise RuntimeError(f"Expected tensors, got unsupported type {type(x)}")
        if keep or not x.requires_grad:
            return x
        return wrap(physical(x).detach(), x._levels) if is_batched(x) else x.detach()
    return tree_map(unwrap, tree)


def _autograd_grad(outputs, inputs, grad_outputs=None, retain_graph=False, create_graph=True, batch=None):
    """autograd.grad as torch.func uses it: outputs that do not require grad are dropped and
    inputs nothing reaches get zeros. batch: the batch size of grad_outputs batched along
    dim 0 (is_grads_batched), whose zeros are batched too. Under vmap: _grad_under_vmap."""
    if grad_outputs is None:
        grad_outputs = [None] * len(outputs)
    pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if o.requires_grad]
    if active_levels():
        return _grad_under_vmap(pairs, inputs, retain_graph, create_graph)

    def zeros(inp):
        shape = tuple(inp.shape) if batch is None else (batch,) + tuple(inp.shape)
        return F._wrap(np.zeros(shape, inp._data.dtype))

    if not pairs:
        return tuple(zeros(i) for i in inputs)
    outs = tuple(o for o, _ in pairs)
    gos = tuple(g for _, g in pairs)
    if all(g is None for g in gos):
        gos = None
    grads = _autograd_grad_fn(outs, tuple(inputs), gos, retain_graph=retain_graph, create_graph=create_graph,
                              allow_unused=True, is_grads_batched=batch is not None)
    return tuple(zeros(i) if g is None else g for g, i in zip(grads, inputs))


def _levels(x):
    return x._levels if is_batched(x) else ()


def _sizes(levels):
    return tuple(level_size(lvl) for lvl in levels)


def _grad_under_vmap(pairs, inputs, retain_graph, create_graph):
    """The pullback's autograd.grad on the physical tensors. The graph is batched over `own`:
    the levels of the inputs (made by _differentiable, batched over every level active when
    the transform started) and of the outputs. Sample b's output depends only on sample b's
    rows of the inputs (rules never mix samples), so one backward of the outputs, aligned to
    `own`, gives each sample's gradient in its rows.

    A cotangent can also be batched over levels the graph is not (`extra`): vmap(vjp_fn) of a
    vjp_fn made outside this vmap, the Jacobian idiom. Each of those samples needs its own
    backward through the same graph: the extra levels are flattened into the batch of an
    is_grads_batched call. (Aligning them to the outputs instead would sum the samples.)"""
    own = set()
    for x in list(inputs) + [o for o, _ in pairs]:
        own.update(_levels(x))
    own = tuple(sorted(own))
    extra = tuple(sorted({lvl for _, g in pairs for lvl in _levels(g)} - set(own)))
    every = tuple(sorted(own + extra))

    def zeros(inp):
        p = physical(inp)
        shape = _sizes(every) + tuple(inp.shape)
        return wrap(F._wrap(np.zeros(shape, p._data.dtype)), every)

    if not pairs:
        return tuple(zeros(i) for i in inputs)
    outs, gos = [], []
    for o, g in pairs:
        po = align(o, own, True)
        if g is None:   # a scalar per sample: the implicit ones of each sample's backward
            g = F._wrap(np.ones(tuple(o.shape), physical(o)._data.dtype))
        outs.append(po)
        gos.append(_to_front(align(g, every, True), every, extra) if extra else align(g, own, True))
    grads = _autograd_grad_fn(outs, [physical(i) for i in inputs], gos, retain_graph=retain_graph,
                              create_graph=create_graph, allow_unused=True, is_grads_batched=bool(extra))
    result = []
    for g, i in zip(grads, inputs):
        if g is None:
            result.append(zeros(i))
        elif extra:
            result.append(wrap(_from_front(g, every, extra, own, i), every))
        else:
            result.append(wrap(g, _levels(i)))
    return tuple(result)


def _to_front(p, every, extra):
    """p (batch dims in `every` order) with the dims of `extra` first, flattened into one."""
    front = [every.index(lvl) for lvl in extra]
    order = front + [k for k in range(p.ndim) if k not in front]
    p = p.permute(tuple(order))
    return p.reshape((-1,) + tuple(p.shape[len(extra):]))


def _from_front(p, every, extra, own, inp):
    """A gradient with the extra dims in front of the input's physical dims (its own levels,
    aligned to `own`), back in `every` order."""
    p = p.reshape(_sizes(extra) + tuple(p.shape[1:]))
    # the input's dims: its levels, then its logical dims; align them to own
    lv = _levels(inp)
    for k, lvl in enumerate(own):
        if lvl not in lv:
            p = p.unsqueeze(len(extra) + k)
    p = p.expand(_sizes(extra) + _sizes(own) + tuple(p.shape[len(extra) + len(own):]))
    at = {lvl: k for k, lvl in enumerate(extra + own)}
    order = [at[lvl] for lvl in every]
    return p.permute(tuple(order) + tuple(range(len(every), p.ndim)))


# --- checks shared by the transforms -----------------------------------------------------

def _check_non_empty_tensor_output(flat, api):
    if (len(flat) == 1 and flat[0] is None) or len(flat) < 1:
        raise RuntimeError(f"{api}: Expected f to be a function that has non-empty output (got output = {flat})")
    for o in flat:
        if not _is_tensor(o):
            raise RuntimeError(f"{api}: expected f(*primals) to return only tensors, got unsupported type {type(o)}")


def _check_non_empty_list_of_tensors(flat, api, argname):
    if len(flat) == 0:
        raise RuntimeError(f"{api}: Expected {argname} to contain at least one Tensor.")
    for x in flat:
        if not _is_tensor(x):
            raise RuntimeError(f"{api}: Expected {argname} to only contain Tensors, got {type(x)}")


def _split_aux(out, api):
    if not (isinstance(out, tuple) and len(out) == 2):
        raise RuntimeError(f"{api}: output of function f should be a tuple: (output, aux) if has_aux is True")
    return out


# --- grad, grad_and_value -----------------------------------------------------------------

def grad_and_value(func, argnums=0, has_aux=False):
    """torch.func.grad_and_value: f's gradient with respect to args[argnums], and f's value."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return _grad_and_value(func, argnums, has_aux, args, kwargs)
    return wrapper


def grad(func, argnums=0, has_aux=False):
    """torch.func.grad: a function computing f's gradient with respect to args[argnums]."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        g, value = _grad_and_value(func, argnums, has_aux, args, kwargs)
        return (g, value[1]) if has_aux else g
    return wrapper


def _grad_and_value(func, argnums, has_aux, args, kwargs):
    api = "grad_and_value(f)(*args)"
    depth = _active.depth
    with _Level(), enable_grad():  # a transform ignores an enclosing no_grad (torch's NOTE)
        argnums, diff = _slice_argnums(args, argnums, as_tuple=False)
        diff = tree_map(_differentiable, diff)
        output = _user(func)(*_replace_args(args, argnums, diff), **kwargs)
        aux = None
        if has_aux:
            output, aux = _split_aux(output, api)
        if not _is_tensor(output):
            raise RuntimeError(f"{api}: Expected f(*args) to return a Tensor, got {type(output)}")
        if output.dim() != 0:
            raise RuntimeError(f"{api}: Expected f(*args) to return a scalar Tensor, got tensor with {output.dim()} "
                               "dims. Maybe you wanted to use the vjp or jacrev APIs instead?")
        flat_diff, spec = tree_flatten(diff)
        keep = _keeps_graph((output,), {id(physical(t)) for t in flat_diff}, depth)
        # a graph kept for outside is retained too: its backward also runs through this
        # forward's nodes (torch keeps them apart by levels, here they are one graph)
        grads = tree_unflatten(_autograd_grad((output,), flat_diff, retain_graph=keep, create_graph=keep), spec)
        output = _unwrap(output, keep)
        if has_aux:
            return grads, (output, _unwrap(aux, keep))
        return grads, output


# --- vjp, jacrev ------------------------------------------------------------------------------

def vjp(func, *primals, has_aux=False):
    """torch.func.vjp: (f(*primals), vjp_fn[, aux]); vjp_fn(cotangents) is the tuple of the
    vector-Jacobian products with respect to each primal."""
    out, pullback, aux = _vjp(func, primals, None, has_aux)

    def vjp_fn(cotangents, retain_graph=True, create_graph=None):
        flat, spec = tree_flatten(cotangents)
        return pullback(flat, spec, retain_graph, create_graph)

    return (out, vjp_fn, aux) if has_aux else (out, vjp_fn)


def _vjp(func, primals, argnums, has_aux):
    """f's value, its pullback (flat cotangents -> the VJPs in the structure of the
    differentiated primals) and aux. argnums None: every primal is differentiated."""
    api = "vjp(f, *primals)"
    depth = _active.depth
    with _Level(), enable_grad():
        if argnums is None:
            diff = primals = tree_map(_differentiable, primals)
        else:
            argnums, diff = _slice_argnums(primals, argnums, as_tuple=False)
            diff = tree_map(_differentiable, diff)
            primals = _replace_args(primals, argnums, diff)
        out = _user(func)(*primals)
        aux = None
        if has_aux:
            out, aux = _split_aux(out, api)
        flat_out, out_spec = tree_flatten(out)
        _check_non_empty_tensor_output(flat_out, api)
        flat_diff, diff_spec = tree_flatten(diff)
        keep = _keeps_graph(flat_out, {id(physical(t)) for t in flat_diff}, depth)
        if has_aux:
            aux = _unwrap(aux, keep)
        for o in flat_out:
            if not o.is_floating_point():
                raise RuntimeError("vjp(f, ...): All outputs of f must be floating-point or complex Tensors, got "
                                   f"Tensor with dtype {o.dtype}")
        result = _unwrap(out, keep)

    def pullback(flat_cotangents, spec, retain_graph=True, create_graph=None, batch=None):
        if spec != out_spec:
            raise RuntimeError("Expected pytree structure of cotangents to be the same as pytree structure of "
                               f"outputs to the function. cotangents: {treespec_pprint(spec)}, primal output: "
                               f"{treespec_pprint(out_spec)}")
        if create_graph is None:
            # torch's default, except that forward mode is not grad mode: inside a jvp/jacfwd
            # the tangents must flow through this backward even under an outer no_grad
            # (jacfwd(jacrev(f)), hessian, under no_grad gave zeros)
            create_graph = is_grad_enabled() or _dual_level_open()
        # the VJPs stay differentiable only for something outside (the module doc)
        create_graph = create_graph and (keep or _active.depth > 0 or _dual_level_open()
                                         or any(_is_tensor(c) and c.requires_grad for c in flat_cotangents))
        with enable_grad():
            grads = _autograd_grad(flat_out, flat_diff, flat_cotangents, retain_graph=retain_graph,
                                   create_graph=create_graph, batch=batch)
        return tree_unflatten(grads, diff_spec)

    return result, pullback, aux


def jacrev(func, argnums=0, *, has_aux=False, chunk_size=None):
    """torch.func.jacrev: the Jacobian of f with respect to args[argnums] by reverse mode, one
    batched backward (autograd.grad(is_grads_batched=True)) per chunk of output rows."""
    if not (chunk_size is None or chunk_size > 0):
        raise ValueError("jacrev: `chunk_size` should be greater than 0.")

    @functools.wraps(func)
    def wrapper(*args):
        out, pullback, aux = _vjp(func, args, argnums, has_aux)
        flat_out, out_spec = tree_flatten(out)
        numels = [o.numel() for o in flat_out]
        total = sum(numels)
        _, primals = _slice_argnums(args, argnums, as_tuple=True)
        flat_primals, primals_spec = tree_flatten(primals)
        levels = active_levels()
        lead = len(levels)
        # under vmap, one row at a time (is_grads_batched would mix its batch with vmap's)
        step = 1 if levels else total if chunk_size is None else min(chunk_size, total)
        # the Jacobian's rows per primal, physically: (vmap dims..., rows, *primal.shape)
        rows = [[] for _ in flat_primals]
        for start in range(0, total, step):
            n = min(step, total - start)
            basis = _basis_chunk(flat_out, numels, start, n)
            if n == 1 and (chunk_size == 1 or levels):
                vjps = pullback([b[0] for b in basis], out_spec)
                vjps = [align(v, levels, True).unsqueeze(lead) for v in tree_flatten(vjps)[0]]
            else:
                vjps = tree_flatten(pullback(basis, out_spec, batch=n))[0]
            for r, v in zip(rows, vjps):
                r.append(v)
        per_primal = [r[0] if len(r) == 1 else F.cat(r, lead) for r in rows]
        jac = []  # per output: the flat list of its blocks, one per primal
        offsets = np.cumsum([0] + numels)
        skip = (slice(None),) * lead
        for k, o in enumerate(flat_out):
            blocks = [wrap(p[skip + (slice(int(offsets[k]), int(offsets[k + 1])),)]
                           .reshape(tuple(p.shape[:lead]) + tuple(o.shape) + tuple(prim.shape)), levels)
                      for p, prim in zip(per_primal, flat_primals)]
            tree = tree_unflatten(blocks, primals_spec)
            jac.append(tree[0] if isinstance(argnums, int) else tree)
        jac = tree_unflatten(jac, out_spec)
        return (jac, aux) if has_aux else jac

    return wrapper


def _basis_chunk(flat_out, numels, start, n):
    """Rows start..start+n of the identity over all outputs' elements, cut per output into
    (n, *output.shape) tensors (torch's _chunked_standard_basis_for_)."""
    chunks = []
    offset = 0
    for o, numel in zip(flat_out, numels):
        block = np.zeros((n, numel), physical(o)._data.dtype)
        for r in range(n):
            col = start + r - offset
            if 0 <= col < numel:
                block[r, col] = 1
        chunks.append(F._wrap(block.reshape((n,) + tuple(o.shape))))
        offset += numel
    return chunks


# --- jvp, jacfwd, hessian ----------------------------------------------------------------------

_JVP = "jvp(f, primals, tangents)"


def jvp(func, primals, tangents, *, strict=False, has_aux=False):
    """torch.func.jvp: (f(*primals), the Jacobian of f at primals times tangents[, aux])."""
    return _jvp(func, primals, tangents, None, strict, has_aux)


def _jvp(func, primals, tangents, argnums, strict, has_aux):
    if not isinstance(primals, tuple):
        raise RuntimeError(f"{_JVP}: Expected primals to be a tuple. E.g. it should be valid to call f(*primals).")
    diff = primals if argnums is None else _slice_argnums(primals, argnums, as_tuple=True)[1]
    flat_primals, primals_spec = tree_flatten(diff)
    flat_tangents, tangents_spec = tree_flatten(tangents)
    if primals_spec != tangents_spec:
        raise RuntimeError(f"{_JVP}: Expected primals and tangents to have the same python structure. For example, "
                           "if primals is a tuple of 3 tensors, tangents also must be. Got primals with structure "
                           f"{primals_spec} and tangents with structure {tangents_spec}")
    _check_non_empty_list_of_tensors(flat_primals, _JVP, "primals")
    _check_non_empty_list_of_tensors(flat_tangents, _JVP, "tangents")
    # one dual level exists at a time: inside one (an enclosing jvp/jacfwd, or the user's),
    # the JVP is computed by reverse mode, which the open level differentiates correctly
    run = _jvp_by_double_vjp if _dual_level_open() else _jvp_by_dual
    depth = _active.depth
    with _Level():
        outs, jvps, aux = run(func, primals, argnums, flat_primals, flat_tangents, primals_spec, has_aux)
        if strict and any(t is None for t in jvps):
            raise RuntimeError("jvp(f, primals, tangents, strict=True): The output of f is independent of the inputs. "
                               "This is not allowed with strict=True.")
        jvps = [_zeros_like(o) if t is None else t for o, t in zip(outs[0], jvps)]
        # an inner reverse transform kept its graph for the dual level; at the outermost
        # transform nothing needs it unless the caller's primals or tangents require grad.
        # (Its leaves are the inner transform's copies, so _reaches_foreign_leaf cannot tell a
        # captured tensor that requires grad from them: such a graph is dropped here.)
        keep = depth > 0 or _dual_level_open() or any(p.requires_grad for p in flat_primals + flat_tangents)
        outs = (_unwrap(outs[0], keep), outs[1])
        jvps = _unwrap(jvps, keep)
        out = tree_unflatten(outs[0], outs[1])
        jvp_out = tree_unflatten(jvps, outs[1])
    return (out, jvp_out, aux) if has_aux else (out, jvp_out)


def _call_checked(func, args, has_aux):
    """func(*args): (flat outputs, their spec) and aux, checked as torch's jvp checks them."""
    out = _user(func)(*args)
    aux = None
    if has_aux:
        out, aux = _split_aux(out, _JVP)
        aux = _unwrap(aux, True)
    flat, spec = tree_flatten(out)
    _check_non_empty_tensor_output(flat, _JVP)
    return flat, spec, aux


def _jvp_by_dual(func, primals, argnums, flat_primals, flat_tangents, primals_spec, has_aux):
    with fwAD.dual_level():
        duals = tree_unflatten([fwAD.make_dual(p, t) for p, t in zip(flat_primals, flat_tangents)], primals_spec)
        args = duals if argnums is None else _replace_args(primals, _normalize_argnums(argnums, len(primals)),
                                                            duals[0] if isinstance(argnums, int) else duals)
        flat, spec, aux = _call_checked(func, args, has_aux)
        unpacked = [fwAD.unpack_dual(o) for o in flat]
    return ([u.primal for u in unpacked], spec), [u.tangent for u in unpacked], aux


def _jvp_by_double_vjp(func, primals, argnums, flat_primals, flat_tangents, primals_spec, has_aux):
    """J t as the VJP of the (linear) map u -> J^T u, with cotangent t."""
    with enable_grad():
        own = [_differentiable(p) for p in flat_primals]
        diff = tree_unflatten(own, primals_spec)
        args = diff if argnums is None else _replace_args(primals, _normalize_argnums(argnums, len(primals)),
                                                          diff[0] if isinstance(argnums, int) else diff)
        flat, spec, aux = _call_checked(func, args, has_aux)
        us = [_zeros_leaf(o) if o.requires_grad else None for o in flat]
        pairs = [(o, u) for o, u in zip(flat, us) if u is not None]
        jvps = [None] * len(flat)
        if pairs:
            vjps = _grad_raw([o for o, _ in pairs], own, [u for _, u in pairs])
            used = [(g, t) for g, t in zip(vjps, flat_tangents) if g is not None]
            if used:
                found = _grad_raw([g for g, _ in used], [u for _, u in pairs], [t for _, t in used])
                found = iter(found)
                jvps = [next(found) if u is not None else None for u in us]
    return (flat, spec), jvps, aux


def _zeros_leaf(o):
    """A zero cotangent for o to differentiate by: under vmap batched over every active level,
    as the transform's inputs are (so _grad_raw keeps each sample in its rows)."""
    levels = active_levels()
    p = F._wrap(np.zeros(_sizes(levels) + tuple(o.shape), physical(o)._data.dtype)).requires_grad_()
    return wrap(p, levels)


def _grad_raw(outputs, inputs, grad_outputs):
    """autograd.grad(create_graph=True, allow_unused=True) of logical tensors; under vmap on
    the physical ones, all aligned to every active level (the inputs are batched over all)."""
    levels = active_levels()
    if not levels:
        return _autograd_grad_fn(outputs, inputs, grad_outputs, create_graph=True, allow_unused=True)
    grads = _autograd_grad_fn([align(o, levels, True) for o in outputs], [physical(i) for i in inputs],
                              [align(g, levels, True) for g in grad_outputs], create_graph=True, allow_unused=True)
    return [None if g is None else wrap(g, levels) for g in grads]


def _zeros_like(x):
    """Zeros of x's logical shape and dtype, the same for every sample (a plain tensor)."""
    return F._wrap(np.zeros(tuple(x.shape), physical(x)._data.dtype))


def jacfwd(func, argnums=0, has_aux=False, *, randomness="error"):
    """torch.func.jacfwd: the Jacobian of f with respect to args[argnums] by forward mode: as
    torch's, one vmap (with the given randomness) of jvp over the standard basis of the
    differentiated inputs, so the columns run as one batched forward."""
    if randomness not in ("error", "different", "same"):
        raise RuntimeError(f"Only allowed values for randomness are 'error', 'different', or 'same'. Got {randomness}")

    @functools.wraps(func)
    def wrapper(*args):
        _, primals = _slice_argnums(args, argnums, as_tuple=True)
        flat_primals, primals_spec = tree_flatten(primals)
        _check_non_empty_list_of_tensors(flat_primals, "jacfwd(f, ...)(*args)", "primals")
        numels = [p.numel() for p in flat_primals]
        offsets = np.cumsum([0] + numels)
        total = int(offsets[-1])
        basis = []     # per primal: (total, *p.shape), the rows of its elements an identity
        for k, p in enumerate(flat_primals):
            b = np.zeros((total, numels[k]), physical(p)._data.dtype)
            b[offsets[k]:offsets[k + 1]] = np.eye(numels[k], dtype=b.dtype)
            basis.append(F._wrap(b.reshape((total,) + tuple(p.shape))))

        def push_jvp(*tangents):
            res = _jvp(func, args, tree_unflatten(list(tangents), primals_spec), argnums, False, has_aux)
            return (res[1], res[2]) if has_aux else res[1]

        out = _vmap(push_jvp, randomness=randomness)(*basis)
        aux = None
        if has_aux:
            out, aux = out
            flat_aux, aux_spec = tree_flatten(aux)
            aux = tree_unflatten([a[0] for a in flat_aux], aux_spec)   # the same in every column
        flat_out, out_spec = tree_flatten(out)
        jac = []
        for col in flat_out:        # (total, *out.shape)
            o_shape = tuple(col.shape[1:])
            rows = col.reshape(total, -1).T      # (out numel, in numel)
            blocks = [rows[:, offsets[k]:offsets[k + 1]].reshape(o_shape + tuple(p.shape))
                      for k, p in enumerate(flat_primals)]
            tree = tree_unflatten(blocks, primals_spec)
            jac.append(tree[0] if isinstance(argnums, int) else tree)
        jac = tree_unflatten(jac, out_spec)
        return (jac, aux) if has_aux else jac

    return wrapper


def hessian(func, argnums=0):
    """torch.func.hessian: jacfwd(jacrev(f)), forward over reverse."""
    return jacfwd(jacrev(func, argnums), argnums)
