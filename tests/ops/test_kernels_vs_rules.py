"""Every primitive's compiled kernel against its Tensor-level rule (DESIGN.md point 6).

The compiled scheduler runs a plain backward; the Python engine runs the same graph when
create_graph=True. Both must give the same gradients, for every primitive in the table,
including broadcasting. The coverage check fails when an op is added without a case here.
"""
import numpy as np
import pytest

import jitgrad as J
from jitgrad.graph.spec import REGISTRY

rng = np.random.default_rng(7)


def t(*shape, lo=0.5, hi=1.5, sign=False):
    a = rng.uniform(lo, hi, shape)
    if sign:
        a *= rng.choice([-1.0, 1.0], shape)
    return J.tensor(a, dtype=J.float64, requires_grad=True)


# op name -> (inputs factory, function); several cases may exercise the same primitive
CASES = {
    "add": (lambda: (t(3, 4), t(4)), lambda a, b: a + b),
    "sub": (lambda: (t(3, 1), t(1, 4)), lambda a, b: a - b),
    "rsub": (lambda: (t(3),), lambda a: 2.0 - a),
    "mul": (lambda: (t(2, 3, 4), t(3, 1)), lambda a, b: a * b),
    "div": (lambda: (t(3, 4), t(3, 4)), lambda a, b: a / b),
    "reciprocal": (lambda: (t(5),), J.reciprocal),
    "pow": (lambda: (t(4),), lambda a: a ** 2.5),
    "pow_tt": (lambda: (t(4), t(4)), lambda a, b: a ** b),
    "rpow": (lambda: (t(4),), lambda a: 1.7 ** a),
    "neg": (lambda: (t(4),), lambda a: -a),
    "exp": (lambda: (t(4),), J.exp),
    "log": (lambda: (t(4),), J.log),
    "log1p": (lambda: (t(4),), J.log1p),
    "expm1": (lambda: (t(4),), J.expm1),
    "sqrt": (lambda: (t(4),), J.sqrt),
    "sin": (lambda: (t(4),), J.sin),
    "cos": (lambda: (t(4),), J.cos),
    "tanh": (lambda: (t(4),), J.tanh),
    "erf": (lambda: (t(5, sign=True),), J.erf),
    "gelu": (lambda: (t(6, sign=True),), J.nn.functional.gelu),
    "sigmoid": (lambda: (t(4, sign=True),), J.sigmoid),
    "relu": (lambda: (t(6, sign=True),), J.relu),
    "abs": (lambda: (t(6, sign=True),), J.abs),
    "sign": (lambda: (t(6, sign=True),), J.sign),
    "clamp": (lambda: (t(6, lo=0.0, hi=2.0),), lambda a: a.clamp(0.5, 1.5)),
    "clone": (lambda: (t(3, 2),), J.clone),
    "asin": (lambda: (t(5, lo=0.1, hi=0.9, sign=True),), J.asin),
    "acos": (lambda: (t(5, lo=0.1, hi=0.9, sign=True),), J.acos),
    "atan": (lambda: (t(5, sign=True),), J.atan),
    "atan2": (lambda: (t(3, 4, sign=True), t(4, sign=True)), J.atan2),
    "nextafter": (lambda: (t(3, 4, sign=True), t(4, sign=True)), J.nextafter),
    # overlapping windows: positions repeat, so the gradient adds where they do
    "as_strided": (lambda: (t(3, 4),), lambda a: J.as_strided(a, (3, 2), (1, 1), 1)),
    "binary_cross_entropy": (lambda: (t(3, 4, lo=0.1, hi=0.9), t(4, lo=0.0, hi=1.0)),
                             lambda a, b: J.nn.functional.binary_cross_entropy(a, b.expand(3, 4), reduction="none")),
    "maximum": (lambda: (t(3, 4), t(4)), J.maximum),
    "minimum": (lambda: (t(3, 4), t(4)), J.minimum),
    "where": (lambda: (t(3, 4, sign=True), t(4)), lambda a, b: J.where(a > 0, a, b)),
    # in-place overwrites (where(False, old, value) under torch's names): the old value gets zero
    "fill": (lambda: (t(3, 4),), lambda a: (a * 1.0).fill_(2.0)),
    "fill_tensor": (lambda: (t(3, 4), t()), lambda a, v: (a * 1.0).fill_(v)),
    "zero": (lambda: (t(3, 4),), lambda a: (a * 1.0).zero_()),
    "copy": (lambda: (t(3, 4), t(4)), lambda a, b: (a * 1.0).copy_(b)),
    "masked_fill": (lambda: (t(3, 4, sign=True),), lambda a: a.masked_fill(a > 0, 0.5)),
    "masked_fill_tensor": (lambda: (t(3, 4, sign=True), t()), lambda a, v: (a * 1.0).masked_fill_(a < 0, v)),
    "sum": (lambda: (t(3, 4, 2),), lambda a: a.sum((0, 2))),
    "sum_all": (lambda: (t(3, 4),), lambda a: a.sum()),
    "mean": (lambda: (t(3, 4),), lambda a: a.mean(1, keepdim=True)),
    "mean_all": (lambda: (t(3, 4),), lambda a: a.mean()),
    "amax": (lambda: (t(3, 4),), lambda a: a.amax(0)),
    "amin": (lambda: (t(3, 4),), lambda a: a.amin(1)),
    "max_all": (lambda: (t(3, 4),), lambda a: a.max()),
    "min_all": (lambda: (t(3, 4),), lambda a: a.min()),
    "max_dim": (lambda: (t(3, 4),), lambda a: a.max(1).values),
    "min_dim": (lambda: (t(3, 4),), lambda a: a.min(0).values),
    "index": (lambda: (t(5, 3),), lambda a: a[J.tensor([0, 2, 2, 4])]),
    "select": (lambda: (t(5, 3),), lambda a: a[1]),
    "slice": (lambda: (t(5, 3),), lambda a: a[1:4, ::2]),
    "split": (lambda: (t(3, 5),), lambda a: a.split(2, 1)[2]),
    "split_with_sizes": (lambda: (t(5, 3),), lambda a: J.split(a, [1, 3, 1])[1]),
    "unbind": (lambda: (t(3, 4),), lambda a: a.unbind(1)[2]),
    "diagonal": (lambda: (t(2, 3, 4),), lambda a: a.diagonal(1, 2, 0)),
    "repeat": (lambda: (t(2, 3),), lambda a: a.repeat(2, 1, 3)),
    "index_put": (lambda: (t(4),), lambda a: J.ops.functional.index_put_flat(a, np.array([0, 2, 2, 5]), (6,))),
    "diag": (lambda: (t(3, 4),), lambda a: J.diag(a, 1)),
    "diag_embed": (lambda: (t(2, 3),), lambda a: J.diag_embed(a, -1, 0, 2)),
    "constant_pad_nd": (lambda: (t(2, 3),), lambda a: J.nn.functional.pad(a, (1, 2, -1, 1))),
    "reflection_pad1d": (lambda: (t(2, 4),), lambda a: J.nn.functional.pad(a, (2, 1), mode="reflect")),
    "replication_pad1d": (lambda: (t(2, 4),), lambda a: J.nn.functional.pad(a, (2, 1), mode="replicate")),
    "reflection_pad3d": (lambda: (t(1, 3, 3, 4),), lambda a: J.nn.functional.pad(a, (1, 2, 1, 0, 2, 1),
                                                                             mode="reflect")),
    "replication_pad3d": (lambda: (t(1, 3, 3, 4),), lambda a: J.nn.functional.pad(a, (1, 2, 1, 0, 2, 1),
                                                                               mode="replicate")),
    "prod": (lambda: (t(3, 4),), lambda a: a.prod(1)),
    "prod_all": (lambda: (t(3, 4),), lambda a: a.prod()),
    "matmul": (lambda: (t(3, 4), t(4, 2)), lambda a, b: a @ b),
    "dot": (lambda: (t(4), t(4)), lambda a, b: a @ b),
    "mv": (lambda: (t(3, 4), t(4)), lambda a, b: a @ b),
    "bmm": (lambda: (t(2, 1, 3, 4), t(3, 4, 2)), lambda a, b: a @ b),
    "addmm": (lambda: (t(1, 3), t(2, 4), t(3, 4)), lambda i, a, b: J.addmm(i, a, b.t(), beta=0.5, alpha=2.0)),
    "linear_mm": (lambda: (t(2, 4), t(3, 4)), lambda x, w: J.nn.functional.linear(x, w)),
    "unsafe_view": (lambda: (t(2, 3, 4), t(5, 4)), lambda x, w: J.nn.functional.linear(x, w)),
    "trace": (lambda: (t(3, 4),), J.trace),
    "permute": (lambda: (t(2, 3, 4),), lambda a: a.permute(2, 0, 1)),
    "transpose": (lambda: (t(2, 3, 4),), lambda a: a.transpose(0, 2)),
    "t": (lambda: (t(2, 3),), lambda a: a.t()),
    "view": (lambda: (t(2, 6),), lambda a: a.reshape(3, 4)),
    "squeeze": (lambda: (t(2, 1, 3),), lambda a: a.squeeze()),
    "squeeze_dim": (lambda: (t(2, 1, 3),), lambda a: a.squeeze(1)),
    "unsqueeze": (lambda: (t(2, 3),), lambda a: a.unsqueeze(1)),
    "expand": (lambda: (t(3, 1),), lambda a: a.expand(2, 3, 4)),
    "cat": (lambda: (t(2, 3), t(4, 3)), lambda a, b: J.cat([a, b], 0)),
    "stack": (lambda: (t(2, 3), t(2, 3)), lambda a, b: J.stack([a, b], 1)),
    "softmax": (lambda: (t(3, 4, sign=True),), lambda a: a.softmax(1)),
    "log_softmax": (lambda: (t(3, 4, sign=True),), lambda a: a.log_softmax(0)),
    "convolution": (lambda: (t(2, 4, 6, 5, sign=True), t(6, 2, 3, 2, sign=True), t(6)),
                    lambda x, w, b: J.nn.functional.conv2d(x, w, b, stride=(2, 1), padding=(1, 2), dilation=(1, 2),
                                                           groups=2)),
    "batch_norm": (lambda: (t(4, 3, 2, 3, sign=True), t(3), t(3)),
                   lambda a, w, b: J.nn.functional.batch_norm(a, None, None, w, b, training=True)),
    "group_norm": (lambda: (t(2, 6, 3, 2, sign=True), t(6), t(6)),
                   lambda a, w, b: J.nn.functional.group_norm(a, 3, w, b)),
    "avg_pool2d": (lambda: (t(2, 3, 5, 6, sign=True),),
                   lambda a: J.nn.functional.avg_pool2d(a, 3, stride=2, padding=1, ceil_mode=True,
                                                        count_include_pad=False)),
    "adaptive_avg_pool2d": (lambda: (t(2, 3, 5, 7, sign=True),),
                            lambda a: J.nn.functional.adaptive_avg_pool2d(a, (3, 4))),
    "max_pool2d": (lambda: (t(2, 3, 5, 6, sign=True),),
                   lambda a: J.nn.functional.max_pool2d(a, 3, stride=2, padding=1)),
    "embedding": (lambda: (t(5, 3),), lambda w: J.nn.functional.embedding(
        J.tensor([[4, 1, 4], [0, 2, 1]]), w, padding_idx=0, scale_grad_by_freq=True)),
    "reflection_pad2d": (lambda: (t(2, 3, 4),), lambda a: J.nn.conv._pad2d(a, (1, 2, 3, 0), "reflect")),
    "replication_pad2d": (lambda: (t(2, 3, 4),), lambda a: J.nn.conv._pad2d(a, (2, 0, 1, 3), "replicate")),
    "layer_norm": (lambda: (t(3, 2, 4, sign=True), t(2, 4, sign=True), t(2, 4)),
                   lambda a, w, b: J.nn.functional.layer_norm(a, (2, 4), w, b)),
    # repeated and ignored targets, class weights, one loss per row
    "nll_loss": (lambda: (t(5, 3),), lambda a: J.nn.functional.nll_loss(
        a, J.tensor([0, 2, -100, 2, 1]), weight=J.tensor([0.5, 1.0, 2.0], dtype=J.float64), reduction="none")),
}
NOT_COMPILED = {"to_copy", "to_device"}  # casts and device copies run in Python


def test_every_primitive_has_a_case():
    primitives = {name for name, spec in REGISTRY.items() if spec.kind != "sink"}  # sinks are not ops
    missing = primitives - set(CASES) - NOT_COMPILED
    assert not missing, f"add a kernel-vs-rule case for: {sorted(missing)}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_kernel_matches_rule(name):
    make, fn = CASES[name]
    ins = make()
    out = fn(*ins)
    assert out.grad_fn is not None and out.grad_fn._spec.name == name, out.grad_fn
    g = J.tensor(rng.standard_normal(tuple(out.shape)), dtype=J.float64)
    compiled = J.autograd.grad(out, ins, g, retain_graph=True)
    python = J.autograd.grad(out, ins, g, create_graph=True)  # runs the Tensor-level rule
    for c, p in zip(compiled, python):
        np.testing.assert_allclose(c.detach().numpy(), p.detach().numpy(), rtol=1e-12, atol=1e-12)
