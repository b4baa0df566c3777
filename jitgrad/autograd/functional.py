"""torch.autograd.functional: vjp, jvp, jacobian, hessian, vhp and hvp of a function of Tensors.

Each takes `func` and its `inputs` (a Tensor or a tuple of Tensors) and answers with the
same structure torch does: a single Tensor where the user gave one, a tuple where they
gave a tuple, and for jacobian/hessian a tuple of tuples indexed [output][input] (or
[input][input]) when both sides are tuples.

The inputs are always replaced by fresh Tensors before `func` runs (a view under
create_graph, a detached copy otherwise), so gradients are taken with respect to what
func received, not to a Tensor it may also capture from outside (torch issue 32576).

jvp and hvp use the double-backward trick, as torch does: the backward of a function
is linear in its grad_output u, so differentiating <J^T u> with respect to u gives J v.
jacobian with vectorize=True takes every row from one `autograd.grad(...,
is_grads_batched=True)` call; strategy="forward-mode" pushes one tangent per input
element through forward AD.
"""
import numpy as np

from jitgrad._core.modes import enable_grad, is_grad_enabled, set_grad_enabled
from jitgrad.autograd import forward_ad as fwAD
from jitgrad.engine.run import grad as _autograd_grad
from jitgrad.graph.tensor import Tensor, tensor, zeros_like
from jitgrad.ops import functional as F

__all__ = ["vjp", "jvp", "jacobian", "hessian", "hvp", "vhp"]

_STRATEGY_ERROR = ('Expected strategy to be either "forward-mode" or "reverse-mode". Hint: If your function has more '
                   'outputs than inputs, "forward-mode" tends to be more performant. Otherwise, prefer to use '
                   '"reverse-mode".')


# --- structure: tuples in, tuples out

def _as_tuple(x, arg_name, fn_name):
    """(was x a tuple?, x as a tuple of Tensors), with torch's TypeError for anything else."""
    is_tuple = isinstance(x, tuple)
    xs = x if is_tuple else (x,)
    for i, el in enumerate(xs):
        if not isinstance(el, Tensor):
            where = f"value at index {i}" if is_tuple else f"given {arg_name}"
            raise TypeError(f"The {arg_name} given to {fn_name} must be either a Tensor or a tuple of Tensors but "
                            f"the {where} has type {type(el)}.")
    return is_tuple, xs


def _as_tuple_nocheck(x):
    if isinstance(x, tuple):
        return x
    if isinstance(x, list):
        return tuple(x)
    return (x,)


def _untuple(res, was_tuple):
    """Undo _as_tuple: `was_tuple` is one flag, or (outer, inner) for a tuple of tuples."""
    if isinstance(was_tuple, tuple):
        outer, inner = was_tuple
        if not inner:
            res = tuple(el[0] for el in res)
        return res if outer else res[0]
    return res if was_tuple else res[0]


def _fresh(inputs, create_graph, need_graph):
    """New Tensor objects for the inputs: a differentiable view where the caller wants
    gradients to reach the originals, a detached copy (requiring grad if need_graph) otherwise."""
    return tuple(t.view_as(t) if create_graph and t.requires_grad else t.detach().requires_grad_(need_graph)
                 for t in inputs)


def _finish(res, create_graph):
    """Detach the results (recursively through nested tuples) unless create_graph."""
    if isinstance(res[0], Tensor):
        return res if create_graph else tuple(t.detach() for t in res)
    return tuple(_finish(r, create_graph) for r in res)


def _check_v(v, ref, ref_is_tuple):
    if len(ref) != len(v):
        if ref_is_tuple:
            raise RuntimeError(f"v is a tuple of invalid length: should be {len(ref)} but got {len(v)}.")
        raise RuntimeError("The given v should contain a single Tensor.")
    for i, (a, b) in enumerate(zip(v, ref)):
        if a.size() != b.size():
            prefix = f"Entry {i} in " if ref_is_tuple else ""
            raise RuntimeError(f"{prefix}v has invalid size: should be {b.size()} but got {a.size()}.")


def _prepare_v(v, fn_name, ref, ref_is_tuple, create_graph, what):
    """v as a tuple checked against ref; None is allowed only for one one-element ref
    (`what` names ref in torch's message)."""
    if v is None:
        if len(ref) != 1 or ref[0].nelement() != 1:
            raise RuntimeError(f"The vector v can only be None if {what} a single Tensor with a single element.")
        return None
    _, v = _as_tuple(v, "v", fn_name)
    v = _fresh(v, create_graph, need_graph=False)
    _check_v(v, ref, ref_is_tuple)
    return v


# --- strict mode

_NOT_REQUIRING = {
    "outputs": "Output {i} of the user-provided function does not require gradients. The outputs must be computed "
               "in a differentiable manner from the input when running in strict mode.",
    "grad_inputs": "The gradient with respect to input {i} is independent of the inputs of the user-provided "
                   "function. This is not allowed in strict mode.",
    "jacobian": "While computing the hessian, found that the jacobian of the user-provided function with respect to "
                "input {i} is independent of the input. This is not allowed in strict mode. You should ensure that "
                "your function is twice differentiable and that the jacobian depends on the inputs (this would be "
                "violated by a linear function for example).",
    "hessian": "The hessian of the user-provided function with respect to input {i} is independent of the input. "
               "This is not allowed in strict mode. You should ensure that your function is thrice differentiable "
               "and that the hessian depends on the inputs.",
}


def _check_requires_grad(ts, kind, strict):
    if not strict:
        return
    for i, t in enumerate(ts):
        if t is None:  # only a gradient can be missing
            raise RuntimeError(f"The output of the user-provided function is independent of input {i}. This is "
                               "not allowed in strict mode.")
        if not t.requires_grad:
            raise RuntimeError(_NOT_REQUIRING[kind].format(i=i))


_MISSING = {
    "back": "The output of the user-provided function is independent of input {i}. This is not allowed in strict "
            "mode.",
    "back_trick": "The gradient with respect to the input is independent of entry {i} in the grad_outputs when "
                  "using the double backward trick to compute forward mode gradients. This is not allowed in strict "
                  "mode.",
    "double_back": "The jacobian of the user-provided function is independent of input {i}. This is not allowed in "
                   "strict mode.",
    "double_back_trick": "The hessian of the user-provided function is independent of entry {i} in the "
                         "grad_jacobian. This is not allowed in strict mode as it prevents from using the double "
                         "backward trick to replace forward mode AD.",
}


def _zeros_for_missing(grads, refs, strict, create_graph, stage):
    """Missing gradients become zeros shaped like refs (their mathematical value), or an
    error in strict mode; under strict+create_graph a gradient must also be differentiable."""
    out = []
    for i, g in enumerate(grads):
        if g is None:
            if strict:
                raise RuntimeError(_MISSING[stage].format(i=i))
            g = zeros_like(refs[i])
        elif strict and create_graph and not g.requires_grad:
            what = "hessian" if "double" in stage else "jacobian"
            raise RuntimeError(f"The {what} of the user-provided function is independent of input {i}. This is not "
                               "allowed in strict mode when create_graph=True.")
        out.append(g)
    return tuple(out)


def _grad(outputs, inputs, grad_outputs=None, create_graph=False, retain_graph=None, is_grads_batched=False):
    """autograd.grad over the outputs that require grad (None outputs allowed); an input
    no output reaches gets None."""
    if grad_outputs is None:
        grad_outputs = (None,) * len(outputs)
    kept = [(o, g) for o, g in zip(outputs, grad_outputs) if o is not None and o.requires_grad]
    if not kept:
        return (None,) * len(inputs)
    outs, gouts = zip(*kept)
    return _autograd_grad(outs, inputs, gouts, allow_unused=True, create_graph=create_graph,
                          retain_graph=retain_graph, is_grads_batched=is_grads_batched)


def _call(func, inputs, fn_name):
    is_tuple, outputs = _as_tuple(func(*inputs), "outputs of the user-provided function", fn_name)
    return is_tuple, outputs


# --- vjp, jvp

def vjp(func, inputs, v=None, create_graph=False, strict=False):
    """(func(inputs), v^T J): the vector-Jacobian product at inputs, shaped like the inputs."""
    with enable_grad():
        inputs_tuple, inputs = _as_tuple(inputs, "inputs", "vjp")
        inputs = _fresh(inputs, create_graph, need_graph=True)
        outputs_tuple, outputs = _call(func, inputs, "vjp")
        _check_requires_grad(outputs, "outputs", strict)
        v = _prepare_v(v, "vjp", outputs, outputs_tuple, create_graph, "the user-provided function returns")
    with set_grad_enabled(True if create_graph else is_grad_enabled()):
        res = _grad(outputs, inputs, v, create_graph=create_graph)
        res = _zeros_for_missing(res, inputs, strict, create_graph, "back")
    return (_untuple(_finish(outputs, create_graph), outputs_tuple),
            _untuple(_finish(res, create_graph), inputs_tuple))


def jvp(func, inputs, v=None, create_graph=False, strict=False):
    """(func(inputs), J v): the Jacobian-vector product, shaped like the outputs, by the
    double-backward trick (as torch: forward AD is jitgrad.func.jvp's way)."""
    with enable_grad():
        inputs_tuple, inputs = _as_tuple(inputs, "inputs", "jvp")
        inputs = _fresh(inputs, create_graph, need_graph=True)
        v = _prepare_v(v, "jvp", inputs, inputs_tuple, create_graph, "the input to the user-provided function is")
        outputs_tuple, outputs = _call(func, inputs, "jvp")
        _check_requires_grad(outputs, "outputs", strict)
        # the backward is linear in u, so u's value never reaches the result; zeros keep
        # it free of inf and nan
        us = tuple(zeros_like(o, requires_grad=True) for o in outputs)
        grad_inputs = _grad(outputs, inputs, us, create_graph=True)
        _check_requires_grad(grad_inputs, "grad_inputs", strict)
    with set_grad_enabled(True if create_graph else is_grad_enabled()):
        res = _grad(grad_inputs, us, v, create_graph=create_graph)
        res = _zeros_for_missing(res, outputs, strict, create_graph, "back_trick")
    return (_untuple(_finish(outputs, create_graph), outputs_tuple),
            _untuple(_finish(res, create_graph), outputs_tuple))


# --- jacobian

def _basis(refs, numels):
    """The identity of size sum(numels), cut into one column block per ref: block i has
    shape (sum(numels), numels[i]) and ref i's dtype. Row r of the blocks together is the
    r-th standard basis vector of all refs flattened and concatenated."""
    total = sum(numels)
    blocks, start = [], 0
    for ref, n in zip(refs, numels):
        block = np.zeros((total, n), dtype=ref._data.dtype)
        block[start:start + n] = np.eye(n, dtype=block.dtype)
        blocks.append(tensor(block, device=ref.device))  # beside the ref: a CUDA input gets CUDA rows
        start += n
    return tuple(blocks)


def _blocks(stacked, numels):
    """Cut dim 0 of `stacked` into consecutive pieces of the given lengths."""
    out, start = [], 0
    for n in numels:
        out.append(stacked[start:start + n])
        start += n
    return out


def jacobian(func, inputs, create_graph=False, strict=False, vectorize=False, strategy="reverse-mode"):
    """The Jacobian of func at inputs: J[i][j] has shape outputs[i].shape + inputs[j].shape."""
    if strategy not in ("forward-mode", "reverse-mode"):
        raise AssertionError(_STRATEGY_ERROR)
    if strategy == "forward-mode":
        if create_graph:
            raise NotImplementedError('torch.autograd.functional.jacobian: `create_graph=True` and '
                                      '`strategy="forward-mode"` are not supported together (yet). Please either set '
                                      '`create_graph=False` or `strategy="reverse-mode"`.')
        return _jacfwd(func, inputs, strict, vectorize)
    with enable_grad():
        inputs_tuple, inputs = _as_tuple(inputs, "inputs", "jacobian")
        inputs = _fresh(inputs, create_graph, need_graph=True)
        outputs_tuple, outputs = _call(func, inputs, "jacobian")
        _check_requires_grad(outputs, "outputs", strict)
        if vectorize:
            if strict:
                raise RuntimeError("torch.autograd.functional.jacobian: `strict=True` and `vectorized=True` are not "
                                   "supported together. Please either set `strict=False` or `vectorize=False`.")
            jac = _jacrev_batched(outputs, inputs, create_graph)
        else:
            jac = tuple(_jacrev_rows(i, out, inputs, strict, create_graph) for i, out in enumerate(outputs))
        return _untuple(_finish(jac, create_graph), (outputs_tuple, inputs_tuple))


def _jacrev_rows(i, out, inputs, strict, create_graph):
    """Output i's Jacobian blocks, one backward per element of out."""
    rows = tuple([] for _ in inputs)
    flat = out.reshape(-1)
    for k in range(out.nelement()):
        vj = _grad((flat[k],), inputs, retain_graph=True, create_graph=create_graph)
        for j, (g, inp) in enumerate(zip(vj, inputs)):
            if g is None:
                if strict:
                    raise RuntimeError(f"Output {i} of the user-provided function is independent of input {j}. "
                                       "This is not allowed in strict mode.")
                g = zeros_like(inp)
            elif strict and create_graph and not g.requires_grad:
                # torch names the output's index here, not the input's
                raise RuntimeError(f"The jacobian of the user-provided function is independent of input {i}. This "
                                   "is not allowed in strict mode when create_graph=True.")
            rows[j].append(g)
    return tuple(F.stack(r, dim=0).view(tuple(out.size()) + tuple(inp.size())) for r, inp in zip(rows, inputs))


def _jacrev_batched(outputs, inputs, create_graph):
    """All Jacobian rows from one batched backward: the grad_outputs are the standard
    basis of the outputs flattened together (see _basis), so row r of the batch is the
    gradient of output element r; each input's (total, *input.shape) answer is then cut
    back into one block per output."""
    numels = tuple(o.nelement() for o in outputs)
    total = sum(numels)
    flat = tuple(o.reshape(-1) for o in outputs)
    vj = _grad(flat, inputs, _basis(outputs, numels), create_graph=create_graph, is_grads_batched=True)
    vj = [zeros_like(inp).expand((total,) + tuple(inp.shape)) if g is None else g for g, inp in zip(vj, inputs)]
    per_input = [[blk.view(tuple(out.shape) + tuple(inp.shape)) for blk, out in zip(_blocks(g, numels), outputs)]
                 for g, inp in zip(vj, inputs)]
    return tuple(zip(*per_input))


def _jacfwd(func, inputs, strict, vectorize):
    if strict:
        raise RuntimeError('torch.autograd.functional.jacobian: `strict=True` and `strategy="forward-mode"` are not '
                           'supported together (yet). Please either set `strict=False` or '
                           '`strategy="reverse-mode"`.')
    inputs_tuple, inputs = _as_tuple(inputs, "inputs", "jacobian")
    if not vectorize:
        # torch's message, missing space included
        raise NotImplementedError("Computing Jacobian using forward-AD or forward-over-reverse Hessian is"
                                  "only implemented for `vectorize=True`.")
    numels = tuple(inp.nelement() for inp in inputs)
    basis = _basis(inputs, numels)
    # torch pushes the whole basis through one vmapped dual pass; here each basis vector
    # is one dual pass, and the tangents are stacked in their order
    outputs_tuple, primals, rows = None, None, []
    for r in range(sum(numels)):
        with fwAD.dual_level():
            duals = tuple(fwAD.make_dual(inp, b[r].view_as(inp)) for inp, b in zip(inputs, basis))
            outputs_tuple, outs = _as_tuple(func(*duals), "outputs", None)
            unpacked = [fwAD.unpack_dual(o) for o in outs]
            primals = [u.primal for u in unpacked]
            rows.append([zeros_like(u.primal) if u.tangent is None else u.tangent for u in unpacked])
    jac = []
    for k, out in enumerate(primals):
        stacked = F.stack([row[k] for row in rows], dim=0)
        # the batch dimension runs over the inputs' elements: it goes last
        jac.append([blk.permute(*range(1, blk.ndim), 0).reshape(tuple(out.shape) + tuple(inp.shape))
                    for blk, inp in zip(_blocks(stacked, numels), inputs)])
    return _untuple(jac, (outputs_tuple, inputs_tuple))


# --- second order

def hessian(func, inputs, create_graph=False, strict=False, vectorize=False, outer_jacobian_strategy="reverse-mode"):
    """The Hessian of a one-element func: the Jacobian (outer, either strategy) of its
    gradient (inner, always reverse mode with create_graph)."""
    inputs_tuple, inputs = _as_tuple(inputs, "inputs", "hessian")
    if outer_jacobian_strategy not in ("forward-mode", "reverse-mode"):
        raise AssertionError('Expected strategy to be either "forward-mode" or "reverse-mode".')

    def scalar_func(*inp):
        out = func(*inp)
        out_tuple, outs = _as_tuple(out, "outputs of the user-provided function", "hessian")
        _check_requires_grad(outs, "outputs", strict)
        if out_tuple or not isinstance(out, Tensor):
            raise RuntimeError("The function given to hessian should return a single Tensor")
        if out.nelement() != 1:
            raise RuntimeError("The Tensor returned by the function given to hessian should contain a single element")
        return out.squeeze()

    def jac_func(*inp):
        if outer_jacobian_strategy == "forward-mode":
            # the inner jacobian keeps its inputs' graph only for inputs requiring grad
            inp = tuple(t.requires_grad_(True) for t in inp)
        jac = jacobian(scalar_func, inp, create_graph=True)
        _check_requires_grad(_as_tuple_nocheck(jac), "jacobian", strict)
        return jac

    res = jacobian(jac_func, inputs, create_graph=create_graph, strict=strict, vectorize=vectorize,
                   strategy=outer_jacobian_strategy)
    return _untuple(res, (inputs_tuple, inputs_tuple))


def _scalar_output(func, inputs, fn_name, strict):
    outputs_tuple, outputs = _call(func, inputs, fn_name)
    _check_requires_grad(outputs, "outputs", strict)
    if outputs_tuple or not isinstance(outputs[0], Tensor):
        raise RuntimeError(f"The function given to {fn_name} should return a single Tensor")
    if outputs[0].nelement() != 1:
        raise RuntimeError(f"The Tensor returned by the function given to {fn_name} should contain a single element")
    return outputs


def _second_order_setup(func, inputs, v, create_graph, strict, fn_name):
    inputs_tuple, inputs = _as_tuple(inputs, "inputs", fn_name)
    inputs = _fresh(inputs, create_graph, need_graph=True)
    v = _prepare_v(v, fn_name, inputs, inputs_tuple, create_graph,
                   "the input to the user-provided function is")
    outputs = _scalar_output(func, inputs, fn_name, strict)
    jac = _grad(outputs, inputs, create_graph=True)
    _check_requires_grad(jac, "jacobian", strict)
    return inputs_tuple, inputs, v, outputs, jac


def vhp(func, inputs, v=None, create_graph=False, strict=False):
    """(func(inputs), v^T H) for a one-element func."""
    with enable_grad():
        inputs_tuple, inputs, v, outputs, jac = _second_order_setup(func, inputs, v, create_graph, strict, "vhp")
    with set_grad_enabled(True if create_graph else is_grad_enabled()):
        res = _grad(jac, inputs, v, create_graph=create_graph)
        res = _zeros_for_missing(res, inputs, strict, create_graph, "double_back")
    return _untuple(_finish(outputs, create_graph), False), _untuple(_finish(res, create_graph), inputs_tuple)


def hvp(func, inputs, v=None, create_graph=False, strict=False):
    """(func(inputs), H v) for a one-element func, by the double-backward trick on its
    gradient: u^T H is linear in u, and its gradient with respect to u is H v."""
    with enable_grad():
        inputs_tuple, inputs, v, outputs, jac = _second_order_setup(func, inputs, v, create_graph, strict, "hvp")
        us = tuple(zeros_like(inp, requires_grad=True) for inp in inputs)
        double_back = _grad(jac, inputs, us, create_graph=True)
        _check_requires_grad(jac, "hessian", strict)
    with set_grad_enabled(True if create_graph else is_grad_enabled()):
        res = _grad(double_back, us, v, create_graph=create_graph)
        res = _zeros_for_missing(res, inputs, strict, create_graph, "double_back_trick")
    return _untuple(_finish(outputs, create_graph), False), _untuple(_finish(res, create_graph), inputs_tuple)
