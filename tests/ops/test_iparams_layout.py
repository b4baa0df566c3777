"""One declaration of a structural op's int params (spec.iparams) is read by all three
users: the forward writes them through spec.pack_ints (which checks their number and names),
the rule reads them by name (ri.iparams().ta), and the kernel reads xs[ip + offset]: this
test holds each kernel's reads to the offsets the declaration gives (spec.ioff)."""
import inspect
import re

import pytest

import jitgrad  # noqa: F401  (fills the table)
from jitgrad.graph.spec import BY_OP

_SPECS = [s for s in BY_OP if s.kind == "struct" and s.base == s.op and s.iparams and s.kernel is not None]


def _source(kernel):
    """The kernel's source and that of the k_* kernels it delegates to."""
    fn = getattr(kernel, "py_func", kernel)
    src = inspect.getsource(fn)
    for name in set(re.findall(r"\b(k_\w+)\(", src)) - {fn.__name__}:
        k = fn.__globals__[name]  # resolved in the kernel's own module
        src += inspect.getsource(getattr(k, "py_func", k))
    return src


def _reads(src):
    """{variable: offset} for the kernel's reads `a, b = xs[ip + 1], xs[ip + 2]` and
    `a = xs[<ip expr> + 1]`, and the offsets of every xs[ip + N...] read."""
    named = {}
    for lhs, rhs in re.findall(r"^\s*([\w, ]+?)\s*=\s*(xs\[[^\n]*)$", src, re.M):
        offs = re.findall(r"xs\[(?:ip|hdr\[b \+ H_IP\]) \+ (\d+)\]", rhs)
        names = [n.strip() for n in lhs.split(",")]
        if len(offs) == len(names):
            named.update({n: int(o) for n, o in zip(names, offs)})
    every = [int(o) for o in re.findall(r"xs\[(?:ip|hdr\[b \+ H_IP\]) \+ (\d+)", src)]
    return named, every


def test_there_are_structural_ops_with_named_int_params():
    assert {"addmm", "cat", "layer_norm", "nll_loss", "softmax", "embedding", "convolution"} <= {s.name for s in _SPECS}


@pytest.mark.parametrize("spec", _SPECS, ids=lambda s: s.name)
def test_kernel_reads_the_declared_offsets(spec):
    src = _source(spec.kernel)
    named, every = _reads(src)
    fixed = [n for n in spec.iparams if not n.startswith("*")]
    for name, off in named.items():
        if name in fixed:
            assert off == spec.ioff(name), f"{spec.name}: kernel reads {name} at ip + {off}, declared {spec.ioff(name)}"
    if fixed and not spec.iparams[-1].startswith("*"):
        assert max(every, default=1) <= len(fixed), f"{spec.name}: kernel reads past the declared int params"
    if spec.iparams[-1].startswith("*") and len(spec.iparams) > 1:
        rest = spec.ioff(spec.iparams[-1])
        assert re.search(rf"xs\[ip \+ {rest} \+ \w+\]", src), f"{spec.name}: variable part not read at ip + {rest}"


def test_pack_ints_checks_names_and_count():
    addmm = next(s for s in BY_OP if s.name == "addmm")
    assert addmm.pack_ints(n=2, k=3, m=4, ta=0, tb=1) == [2, 3, 4, 0, 1]
    with pytest.raises(ValueError):
        addmm.pack_ints(n=2, k=3, m=4, ta=0)
    with pytest.raises(ValueError):
        addmm.pack_ints(2, 3, 4)
    assert addmm.read_ints((2, 3, 4, 0, 1)).tb == 1
    cat = next(s for s in BY_OP if s.name == "cat")
    assert cat.read_ints((1, 5, 2, 0, 2, 3)).sizes == (2, 3)
