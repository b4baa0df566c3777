"""PyTorch's own test_autograd.py tests that jitgrad failed (issue 26), ported: each runs the
same code on jitgrad and on torch 2.13 (both(run) compares what run(T) returns) or states
torch's behaviour where the test is about memory. The torch test each one follows is named
in its docstring."""
import copy
import importlib
import threading
import weakref
from collections import OrderedDict

import pytest
from conftest import both, err_of, mk

import jitgrad

torch = pytest.importorskip("torch")


def graph_desc(fn):
    """test_autograd.py's graph_desc: a node and its next_functions, recursively."""
    if fn is None:
        return "None"
    return type(fn).__name__ + "(" + ", ".join(graph_desc(f) for f, _ in fn.next_functions) + ")"


def no_default_hooks(T):
    """Whether this thread's saved-tensors-hooks stack is empty: a raw saved value accepts
    hooks only if no default hooks packed it (torch's own check in these tests)."""
    a = mk(T, [1.0], rg=True)
    with T.enable_grad():
        y = a.exp()
    return err_of(y.grad_fn._raw_saved_result.register_hooks, lambda x: x, lambda x: x) is None


# --- saved-tensor hooks entered or exited during backward -------------------------------

def test_saved_tensor_hooks_extra_exit_during_bw_no_crash():
    """test_saved_tensor_hooks_extra_exit_during_bw_no_crash: an unpack hook exits a context
    during backward; the stack is the call's again after it, and exits pop the innermost."""
    def run(T):
        def unpack(x):
            ctx_1.__exit__()
            return x

        ctx_1 = T.autograd.graph.saved_tensors_hooks(lambda x: x, unpack)
        ctx_2 = T.autograd.graph.saved_tensors_hooks(lambda x: x, lambda x: x)
        for _ in range(10):
            with ctx_2:
                ctx_1.__enter__()
                x = mk(T, [[0.5, 1.0], [2.0, 3.0]], rg=True)
                x.sin().sum().backward()
        left = no_default_hooks(T)
        for _ in range(10):
            ctx_1.__exit__()
        return left, no_default_hooks(T), err_of(ctx_1.__exit__)[0]

    j, t = both(run)
    assert t == (False, True, "RuntimeError")


def test_saved_tensor_hooks_extra_enter_during_bw_no_leak(no_gc):
    """test_saved_tensor_hooks_extra_enter_during_bw_no_leak: a context an unpack hook enters
    during backward does not outlive the backward (nothing keeps the hook alive)."""
    def run(T):
        def scope():
            def unpack(x):
                weak_ctx_1().__enter__()
                return x

            ctx_1 = T.autograd.graph.saved_tensors_hooks(lambda x: x, unpack)
            weak_ctx_1 = weakref.ref(ctx_1)
            x = mk(T, [1.0, 2.0], rg=True)
            with ctx_1:
                x.sin().sum().backward()
            return weakref.ref(unpack)

        ref = scope()
        return ref() is None, no_default_hooks(T)

    j, t = both(run)
    assert t == (True, True)


@pytest.mark.parametrize("where", ["hook", "function", "unpack"])
def test_saved_tensor_hooks_entered_or_exited_in_backward_are_the_calls(where):
    """Whatever user code run by backward (a tensor hook, a custom Function's backward, an
    unpack hook) pushes or pops, the stack after the call is the one it began with; during
    the call, a pop by one piece of code is seen by the next (one thread state per call)."""
    def run(T):
        seen = []
        outer = T.autograd.graph.saved_tensors_hooks(lambda x: ("outer", x), lambda p: p[1])
        inner = T.autograd.graph.saved_tensors_hooks(lambda x: x, lambda x: x)

        def meddle():
            seen.append(no_default_hooks(T))
            outer.__exit__()
            inner.__enter__()
            inner.__enter__()

        class F(T.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, g):
                if where == "function":
                    meddle()
                return g * 2

        def unpack(x):
            if where == "unpack":
                meddle()
            return x

        x = mk(T, [1.0, 2.0], rg=True)
        with outer:
            with T.autograd.graph.saved_tensors_hooks(lambda x: x, unpack):
                y = F.apply(x.exp())
            if where == "hook":
                y.register_hook(lambda g: meddle())
            y.sum().backward()
            during = no_default_hooks(T)
        return seen, during, no_default_hooks(T), x.grad

    j, t = both(run)
    assert t[0] == [False] and t[1:3] == (False, True)


def test_saved_tensors_hooks_stack_is_per_thread():
    """The stack is thread-local: another thread starts with none and its contexts are its own."""
    def run(T):
        out = []
        with T.autograd.graph.saved_tensors_hooks(lambda x: x, lambda x: x):
            def work():
                out.append(no_default_hooks(T))
                with T.autograd.graph.saved_tensors_hooks(lambda x: x, lambda x: x):
                    out.append(no_default_hooks(T))
            th = threading.Thread(target=work)
            th.start()
            th.join()
            out.append(no_default_hooks(T))
        out.append(no_default_hooks(T))
        return out

    j, t = both(run)
    assert t == [True, False, False, True]


def test_disable_saved_tensors_hooks_nesting_and_misuse():
    """test_disabling_saved_tensor_hooks(_nested): the message of the innermost disable
    raises; leaving restores the outer one; disabling with hooks active raises; it is a
    function (a generator context), so it decorates too."""
    def run(T):
        g = T.autograd.graph
        out = []
        with g.disable_saved_tensors_hooks("outer"):
            with g.disable_saved_tensors_hooks("inner"):
                out.append(err_of(lambda: g.saved_tensors_hooks(lambda x: x, lambda x: x).__enter__()))
            out.append(err_of(lambda: g.saved_tensors_hooks(lambda x: x, lambda x: x).__enter__()))
        with g.saved_tensors_hooks(lambda x: x, lambda x: x):
            out.append(err_of(lambda: g.disable_saved_tensors_hooks("active").__enter__()))
        out.append(no_default_hooks(T))

        @g.disable_saved_tensors_hooks("decorated")
        def f():
            return err_of(lambda: g.save_on_cpu().__enter__())

        out.append(f())
        out.append(no_default_hooks(T))
        return out

    both(run)


# --- an optimizer stepped inside backward by post-accumulate-grad hooks ------------------

def _optim_in_backward(T, engine):
    """test_post_accumulate_grad_hook_e2e: each parameter's own Adam steps from its
    post-accumulate-grad hook (torch's optimizer-in-backward pattern) and must track a copy
    of the model trained the usual way; once the hooks are removed the model is frozen.
    engine: how backward runs (the compiled sweep, the Python engine under create_graph or
    anomaly mode, a jitgrad.compile step)."""
    model = T.nn.Linear(3, 2).double()
    with T.no_grad():  # the same weights in both libraries (their generators differ)
        model.weight.copy_(mk(T, [[0.3, -0.1, 0.2], [-0.4, 0.25, 0.5]]))
        model.bias.copy_(mk(T, [0.05, -0.15]))
    inp = mk(T, [[0.1, -0.2, 0.3], [0.4, 0.5, -0.6]])
    optims, handles = {}, []

    def optim_step_hook(param):
        optims[param].step()
        optims[param].zero_grad()

    for p in model.parameters():
        optims[p] = T.optim.Adam([p])
        handles.append(p.register_post_accumulate_grad_hook(optim_step_hook))
    model_copy = copy.deepcopy(model)  # the hooks stay behind (torch's deepcopy copies none)
    optim_copy = T.optim.Adam(model_copy.parameters())

    def step(x):
        loss = model(x).sum()
        if engine == "create_graph":
            loss.backward(create_graph=True)
        else:
            loss.backward()
        return loss

    if engine == "jitgrad.compile" and T.__name__ == "jitgrad":
        step = T.compile(step)
    for _ in range(5):
        if engine == "anomaly":
            with T.autograd.set_detect_anomaly(True):
                step(inp)
        else:
            step(inp)
        model_copy(inp).sum().backward()
        optim_copy.step()
        optim_copy.zero_grad()
    tracked = [p.detach().clone() for p in model.parameters()]
    reference = [p.detach().clone() for p in model_copy.parameters()]
    for h in handles:
        h.remove()
    for _ in range(3):
        step(inp)
    frozen = [p.detach().clone() for p in model.parameters()]
    return tracked, reference, frozen, [p.grad is None for p in model.parameters()]


@pytest.mark.parametrize("engine", ["compiled", "create_graph", "anomaly", "jitgrad.compile"])
def test_post_accumulate_grad_hook_e2e(engine):
    j, t = both(lambda T: _optim_in_backward(T, engine))
    tracked, reference, frozen, _ = j
    for a, b, c in zip(tracked, reference, frozen):
        assert a.tolist() == b.tolist() == c.tolist()


def test_deepcopy_of_tensors_and_parameters_as_torch():
    """Tensor.__deepcopy__ / Parameter.__deepcopy__: no hooks travel, a tensor's .grad and
    attributes do, a parameter's .grad does not; a non-leaf cannot be deep-copied."""
    def run(T):
        out = []
        hooked = []
        x = mk(T, [1.0, 2.0], rg=True)
        x.register_hook(lambda g: hooked.append("x"))
        x.register_post_accumulate_grad_hook(lambda t: hooked.append("post"))
        (x * 2).sum().backward()
        x.note = {"k": [1]}
        c = copy.deepcopy(x)
        out += [c.requires_grad, c.is_leaf, c.grad, c.note, c.note is x.note, c._backward_hooks]
        (c * 3).sum().backward()
        out += [c.grad, hooked]
        p = T.nn.Parameter(mk(T, [3.0]))
        (p * p).sum().backward()
        q = copy.deepcopy(p)
        out += [type(q).__name__, q.grad, q.requires_grad, q.detach()]
        shared = copy.deepcopy([x, x])
        out.append(shared[0] is shared[1])
        out.append(err_of(copy.deepcopy, x * 2))
        return out

    both(run)


# --- Tensor._backward_hooks ---------------------------------------------------------------

@pytest.mark.parametrize("leaf", [True, False])
def test_assigning_backward_hooks(leaf):
    """torch allows `t._backward_hooks = OrderedDict()` or None (nn.Module's hooks and old
    code do): either removes the tensor's hooks; a dict of functions makes them its hooks."""
    def run(T):
        seen = []
        x = mk(T, [1.0, 2.0], rg=True)
        t = x if leaf else x * 1
        out = [t._backward_hooks]
        t.register_hook(lambda g: seen.append("removed"))
        t._backward_hooks = OrderedDict()
        (t * 2).sum().backward(retain_graph=True)
        t._backward_hooks = None
        (t * 2).sum().backward(retain_graph=True)
        t._backward_hooks = OrderedDict([(7, lambda g: seen.append(g.tolist()) or g * 10)])
        out.append(len(t._backward_hooks))
        (t * 2).sum().backward()
        out += [seen, x.grad, err_of(delattr, t, "_backward_hooks")]
        return out

    both(run)


# --- anomaly mode frees the graph like normal mode ---------------------------------------

def test_anomaly_assign_parent_cleanup(no_gc):
    """test_anomaly_assign_parent_cleanup: a node made by a backward in anomaly mode names
    its parent; that must not keep the parent's graph alive once its tensors are gone
    (checked by refcounts alone: the cycle collector is off)."""
    def run(T):
        def get_ref():
            x = mk(T, [[0.5, 1.0], [1.5, 2.0]], rg=True)
            t = x.exp()
            with T.autograd.detect_anomaly():
                T.autograd.grad(t, x, T.ones_like(t), create_graph=True)

            class Foo:
                pass

            my_obj = Foo()
            t.grad_fn.metadata[0] = my_obj
            return t, weakref.ref(my_obj)

        with pytest.warns(UserWarning, match="Anomaly Detection has been enabled"):
            t, ref = get_ref()
        alive = ref() is not None
        del t
        return alive, ref() is None

    j, t = both(run)
    assert t == (True, True)


def test_nested_anomaly_printstack_cleanup(no_gc):
    """test_nested_anomaly_printstack_cleanup: the same after anomaly mode reported a NaN
    through a parent chain (custom Functions, the parent made under create_graph)."""
    def run(T):
        def get_ref():
            class MyFunc(T.autograd.Function):
                @staticmethod
                def forward(ctx, x):
                    ctx.save_for_backward(x)
                    return x

                @staticmethod
                def backward(ctx, gO):
                    (x,) = ctx.saved_tensors
                    return MyFunc2.apply(x)

            class MyFunc2(T.autograd.Function):
                @staticmethod
                def forward(ctx, x):
                    return x

                @staticmethod
                def backward(ctx, gO):
                    return gO + float("NaN")

            inp = mk(T, [0.25], rg=True)
            out = MyFunc.apply(inp)
            (ginp,) = T.autograd.grad(out, (inp,), create_graph=True)
            with pytest.warns(UserWarning) as w:
                with T.autograd.detect_anomaly():
                    e = err_of(ginp.backward)
            msgs = [str(m.message).split(".")[0] for m in w]

            class Foo:
                pass

            my_obj = Foo()
            out.grad_fn.metadata[0] = my_obj
            return out, weakref.ref(my_obj), e, msgs

        out, ref, e, msgs = get_ref()
        alive = ref() is not None
        del out
        return alive, ref() is None, e, msgs

    j, t = both(run)
    assert t[:2] == (True, True) and t[2][1].startswith("Function 'MyFunc2Backward' returned nan values")


# --- once_differentiable ---------------------------------------------------------------

def test_once_differentiable():
    """test_once_differentiable: under create_graph the results of a once_differentiable
    backward come through torch's Error node, with an edge per result ((None, 0) for the
    None given to a non-tensor input), and differentiating through it raises. The
    Function's own node has edges for its tensor inputs only."""
    def run(T):
        once_differentiable = importlib.import_module(T.__name__ + ".autograd.function").once_differentiable
        grad_enabled = []

        class MyFunction(T.autograd.Function):
            @staticmethod
            def forward(ctx, tensor1, pyscalar, tensor2):
                ctx.pyscalar = pyscalar
                ctx.save_for_backward(tensor1, tensor2)
                return tensor1 + pyscalar * tensor2 + tensor1 * tensor2

            @staticmethod
            @once_differentiable
            def backward(ctx, grad_output):
                grad_enabled.append(T.is_grad_enabled())
                t1, t2 = ctx.saved_tensors
                return grad_output + grad_output * t2, None, grad_output * ctx.pyscalar + grad_output * t1

        x = mk(T, [[0.5, -1.0], [2.0, 0.25]], rg=True)
        y = mk(T, [[1.5, 0.75], [-0.5, 3.0]], rg=True)
        result = MyFunction.apply(x, 2, y)
        go = T.ones((), dtype=T.float64, requires_grad=True)
        result.sum().backward(go, create_graph=True)
        out = [graph_desc(result.grad_fn), graph_desc(x.grad.grad_fn), graph_desc(y.grad.grad_fn), x.grad, y.grad,
               grad_enabled, x.grad.grad_fn.next_functions[1][0].next_functions[1]]
        out.append(err_of(x.grad.sum().backward))
        return out

    j, t = both(run)
    assert t[1] == "CopyBackwards(None, Error(AccumulateGrad(), None, AccumulateGrad()))"


# --- raw saved variables, saved originals ----------------------------------------------

def test_get_data_and_hooks_from_raw_saved_variable():
    """test_get_data_and_hooks_from_raw_saved_variable: .data is the packed object as is
    when hooks packed it, a detached value for a saved output, the input itself (not a
    copy) for a saved non-leaf input; .unpack_hook is the hook or None."""
    def run(T):
        def pack_hook(t):
            return t

        def unpack_hook(t):
            return t

        a = T.tensor(2.0, dtype=T.float64, requires_grad=True)
        with T.autograd.graph.saved_tensors_hooks(pack_hook, unpack_hook):
            b = a ** 2
        c = b.exp()
        d = c ** 2
        pow_sv, exp_sv, pow2_sv = b.grad_fn._raw_saved_self, c.grad_fn._raw_saved_result, d.grad_fn._raw_saved_self
        return [pow_sv.data is a, pow_sv.unpack_hook is unpack_hook, exp_sv.data is c, exp_sv.unpack_hook is None,
                pow2_sv.data is c, pow2_sv.unpack_hook is None, exp_sv.data, pow2_sv.data]

    j, t = both(run)
    assert t[:6] == [True, True, False, True, True, True]


@pytest.mark.parametrize("shape", [(), (3,), (2, 3)])
def test_saved_originals_are_the_same_python_objects(shape):
    """Which saved values come back as the very object that was saved (torch's saved
    original: inputs, leaf or not, of built-in ops and custom Functions) and which as a new
    one (outputs, saved without their node to avoid a cycle); also once .data was
    reassigned and for a custom Function that returns a view of a saved input."""
    def run(T):
        import numpy as np
        a = T.tensor(np.linspace(0.5, 1.5, int(np.prod(shape))).reshape(shape), dtype=T.float64,
                     requires_grad=True)
        b = a * 1
        out = {}
        for nm, inp in (("leaf", a), ("nonleaf", b)):
            z = inp * inp
            out["mul_self_" + nm] = (z.grad_fn._saved_self is inp, z.grad_fn._raw_saved_other.data is inp)
            w = inp.sin()
            out["sin_" + nm] = w.grad_fn._saved_self is inp
        y = a.exp()
        out["exp_result"] = y.grad_fn._saved_result is y
        c = b.exp()
        d = c.sin()
        c.data = c.detach() * 2
        out["after_data_assign"] = d.grad_fn._saved_self is c

        class Fn(T.autograd.Function):
            @staticmethod
            def forward(ctx, x, kind):
                o = x * 2
                t = x + 1
                saved = {"in": x, "out": o, "intermediate": t}[kind]
                ctx.save_for_backward(saved)
                ctx.kind = kind
                return o

            @staticmethod
            def backward(ctx, g):
                return g * 2, None

        class ViewFn(T.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x.view_as(x)

            @staticmethod
            def backward(ctx, g):
                return g

        for nm, inp in (("leaf", a), ("nonleaf", b)):
            for kind in ("in", "out"):
                o = Fn.apply(inp, kind)
                out[f"fn_{kind}_{nm}"] = o.grad_fn.saved_tensors[0] is (inp if kind == "in" else o)
            v = ViewFn.apply(inp.clone() if nm == "nonleaf" else inp)
            out["view_fn_" + nm] = v.grad_fn.saved_tensors[0] is not v
        return out

    j, t = both(run)
    assert t["mul_self_nonleaf"] == (True, True) and t["exp_result"] is False


def test_custom_function_saved_tensors():
    """test_custom_function_saved_tensors: saved_tensors and _raw_saved_tensors (SavedTensor
    objects, None included), register_hooks' argument checks, errors after the graph is
    freed, a Function that saved nothing."""
    def run(T):
        SavedTensor = T.autograd.graph.SavedTensor if T.__name__ == "jitgrad" else T._C._autograd.SavedTensor

        def get_fn(save=True):
            class MyFn(T.autograd.Function):
                @staticmethod
                def forward(ctx, x):
                    if save:
                        ctx.save_for_backward(x, None)
                    return x

                @staticmethod
                def backward(ctx, g):
                    return g

            return MyFn

        a = mk(T, [0.5, 1.5, -2.0], rg=True)
        y = get_fn(True).apply(a)
        st = y.grad_fn.saved_tensors
        out = [st[0] is a, st[1]]
        saved = y.grad_fn._raw_saved_tensors
        out.append([isinstance(s, SavedTensor) for s in saved])
        out.append(err_of(saved[1].register_hooks, lambda x: x, lambda x: x))
        out.append(err_of(saved[0].register_hooks, lambda x: x)[0])
        out.append(err_of(saved[0].register_hooks, 1, 1)[0])
        out.append(err_of(saved[0].register_hooks, lambda x: x, lambda x: x))
        out.append(err_of(saved[0].register_hooks, lambda x: x, lambda x: x))
        y.sum().backward()
        del saved
        out.append(err_of(lambda: y.grad_fn._raw_saved_tensors))
        out.append(err_of(lambda: y.grad_fn.saved_tensors))
        y = get_fn(False).apply(a)
        out += [y.grad_fn.saved_tensors, y.grad_fn._raw_saved_tensors]
        return out

    both(run)


def test_clear_saved_tensors_on_access(no_gc):
    """test_clear_saved_tensors_on_access(_double_access_error): the ctx lets go of what it
    saved once backward read it; a second read raises torch's error."""
    def run(T):
        out = []

        class MyFn(T.autograd.Function):
            clear_saved_tensors_on_access = True

            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x.clone()

            @staticmethod
            def backward(ctx, grad_output):
                (x,) = ctx.saved_tensors
                ref = weakref.ref(x)
                del x
                out.append(ref() is None)
                return grad_output

        class Twice(MyFn):
            @staticmethod
            def backward(ctx, grad_output):
                _ = ctx.saved_tensors
                _ = ctx.saved_tensors
                return grad_output

        x = mk(T, [1.0, 2.0, 3.0], rg=True)
        MyFn.apply(x.clone()).sum().backward()
        out.append(err_of(Twice.apply(x).sum().backward))
        y = MyFn.apply(x)
        out.append(len(y.grad_fn.saved_tensors))
        out.append(err_of(lambda: y.grad_fn.saved_tensors))
        return out

    j, t = both(run)
    assert t[0] is True


# --- tensor hooks on non-leaves ---------------------------------------------------------
# Each scenario returns what the hooks saw and the gradients that came out; run under the
# compiled sweep and (create_graph) the Python engine, against torch. They follow
# test_hooks, test_retain_grad_inplace(_multiple_outputs), test_tensor_hooks_inplace
# (_multiple_outputs, _over_view), test_retains_grad_can_always_observe_tensor_prehook,
# test_accumulate_grad_posthooks_can_observe_tensor_prehook and
# test_hook_edge_case_when_called_with_grad.

def _bw(T, t, cg, **kw):
    t.backward(**kw, create_graph=cg, retain_graph=True)


def _hooks_basic(T, cg):
    x = T.ones(5, 5, dtype=T.float64, requires_grad=True)
    y = (T.ones(5, 5, dtype=T.float64) * 4).requires_grad_()
    counter = [0]
    z = x ** 2 + x * 2 + x * y + y
    x.register_hook(lambda g: counter.__setitem__(0, counter[0] + 0))
    test = z.register_hook(lambda g: counter.__setitem__(0, counter[0] + 1))
    out = []
    _bw(T, z, cg, gradient=T.ones(5, 5, dtype=T.float64))
    test2 = z.register_hook(lambda g: counter.__setitem__(0, counter[0] + 2))
    _bw(T, z, cg, gradient=T.ones(5, 5, dtype=T.float64))
    out.append(counter[0])
    test2.remove()
    _bw(T, z, cg, gradient=T.ones(5, 5, dtype=T.float64))
    out.append(counter[0])
    test.remove()
    z.register_hook(lambda g: g.mul(2))
    y.grad = None
    _bw(T, z, cg, gradient=T.ones(5, 5, dtype=T.float64))
    out.append(y.grad.detach())
    z.register_hook(lambda g: g.mul(2))
    y.grad = None
    _bw(T, z, cg, gradient=T.ones(5, 5, dtype=T.float64))
    return out + [y.grad.detach()]


def _retain_grad_inplace(T, cg):
    out = []
    for n_inplace in (1, 2):
        a = mk(T, [1.0, 2.0], rg=True)
        b = a.clone()
        b.retain_grad()
        for k in range(n_inplace):
            b.mul_(2 + k)
        _bw(T, b.sum(), cg)
        out += [b.grad.detach(), a.grad.detach()]
    a = mk(T, [1.0, 2.0], rg=True)
    b = a.clone()
    b.retain_grad()
    c = b * 2
    b.mul_(2)
    _bw(T, (b + c).sum(), cg)
    return out + [b.grad.detach(), a.grad.detach()]


def _hooks_and_inplace(T, cg):
    seen = []

    def hook(tag, factor):
        def fn(g):
            seen.append((tag, g.tolist()))
            return None if factor is None else g * factor
        return fn

    a = mk(T, [1.0, 2.0], rg=True)
    b = a.clone()
    b.register_hook(hook("before", 2))
    b.mul_(2)
    b.register_hook(hook("after", 3))
    _bw(T, b.sum(), cg)
    out = [a.grad.detach()]
    a = mk(T, [1.0, 2.0, 3.0], rg=True)
    b = a.clone()
    v = b[:2]
    b.register_hook(hook("base", 2))
    v.register_hook(hook("view", 3))
    v.mul_(2)
    b.register_hook(hook("base_after", 5))
    _bw(T, b.sum(), cg)
    out.append(a.grad.detach())
    a = mk(T, [1.0, 2.0, 3.0], rg=True)
    b = a * 1
    b.register_hook(hook("b_old", None))
    b[0].mul_(5)
    b.register_hook(hook("b_new", None))
    _bw(T, (b * mk(T, [1.0, 2.0, 3.0])).sum(), cg)
    out.append(a.grad.detach())
    return seen, out


def _order_with_retain_grad(T, cg):
    seen = []
    a = mk(T, [1.0, 2.0], rg=True)
    b = a * 2
    b.register_hook(lambda g: seen.append(("h1", g.tolist())) or g * 10)
    b.retain_grad()
    b.register_hook(lambda g: seen.append(("h2", g.tolist())) or g + 1)
    _bw(T, (b * 3).sum(), cg)
    out = [b.grad.detach(), a.grad.detach()]
    a = mk(T, [1.0, 2.0], rg=True)
    b = a.clone()
    b.retain_grad()
    b.register_hook(lambda g: g * 2)
    _bw(T, b.sum(), cg)
    out.append(b.grad.detach())
    b.grad = None
    b.register_hook(lambda g: g * 3)
    _bw(T, b.sum(), cg)
    out.append(b.grad.detach())
    a = mk(T, [1.0, 2.0], rg=True)
    a.register_hook(lambda g: g * 2)
    a.register_post_accumulate_grad_hook(lambda t: seen.append(("post", t.grad.tolist())))
    a.register_hook(lambda g: g * 3)
    _bw(T, (a * 1).sum(), cg)
    return seen, out + [a.grad.detach()]


def _hooks_write_in_place(T, cg):
    """A hook (tensor hook or node pre-hook) that writes the gradient it got in place and
    returns it or None: torch's hooks get the engine's own buffer, so the write counts."""
    def write(g, ret):
        g.mul_(2)
        return g if ret else None

    def write_first(gs):
        gs[0].mul_(5)

    out = []
    for ret in (True, False):
        a = mk(T, [1.0, 2.0], rg=True)
        b = a * 2
        b.register_hook(lambda g: write(g, ret))
        _bw(T, (b * 3).sum(), cg)
        out.append(a.grad.detach())
        c = a * 2
        d = c * 3
        d.grad_fn.register_prehook(write_first)
        a.grad = None
        _bw(T, (d * mk(T, [1.0, 1.5])).sum(), cg)  # (a sum's gradient is an expanded view: not writable)
        out.append(a.grad.detach())
    return out


def _hooks_called_with_grad(T, cg):
    a = mk(T, [1.0, 2.0], rg=True)
    b = a * 2
    c = b * 2
    counts = [0, 0, 0]

    def count(i):
        def fn(*args):
            counts[i] += 1
        return fn

    for t in (a, b, c):
        t.register_hook(count(0))
    for n in (c.grad_fn, b.grad_fn):
        n.register_prehook(count(1))
        n.register_hook(count(2))
    out = []
    for call in (lambda: T.autograd.grad(c, inputs=(b,), grad_outputs=T.ones_like(c), retain_graph=True,
                                         create_graph=cg),
                 lambda: T.autograd.grad(c, inputs=(a, b), grad_outputs=T.ones_like(c), retain_graph=True,
                                         create_graph=cg),
                 lambda: _bw(T, c, cg, gradient=T.ones_like(c)),
                 lambda: _bw(T, c, cg, gradient=T.ones_like(c), inputs=(a, b))):
        counts[:] = [0, 0, 0]
        call()
        out.append(list(counts))
    return out


def _bad_hook_returns(T, cg):
    out = []
    for ret in (lambda g: g.float(), lambda g: g[:1], lambda g: 3, lambda g: (g,)):
        a = mk(T, [1.0, 2.0], rg=True)
        b = a * 2
        b.register_hook(ret)
        out.append(err_of(_bw, T, (b * 3).sum(), cg))
    return out


@pytest.mark.parametrize("create_graph", [False, True], ids=["compiled", "python_engine"])
@pytest.mark.parametrize("scenario", [_hooks_basic, _retain_grad_inplace, _hooks_and_inplace, _order_with_retain_grad,
                                      _hooks_write_in_place, _hooks_called_with_grad, _bad_hook_returns],
                         ids=lambda f: f.__name__.strip("_"))
def test_tensor_hooks_see_torchs_gradients(scenario, create_graph):
    both(lambda T: scenario(T, create_graph))


# --- checkpoint's determinism check -------------------------------------------------------

def _nondeterministic(first, then):
    calls = [0]

    def fn(x):
        calls[0] += 1
        return first(x) if calls[0] == 1 else then(x)
    return fn


def _checkpoint_outcome(T, first, then, use_reentrant=False, early_stop=True, **kw):
    cp = importlib.import_module(T.__name__ + ".utils.checkpoint")
    a = mk(T, [0.5], rg=True)
    with cp.set_checkpoint_early_stop(early_stop):
        e = err_of(lambda: cp.checkpoint(_nondeterministic(first, then), a, use_reentrant=use_reentrant,
                                         **kw).sum().backward())
    if e is None:
        return None, a.grad
    # up to the end of torch's tip (its torch.compile paragraph after that is not jitgrad's)
    msg = e[1]
    end = msg.find("checkpoint\u2011debug mode globally.")
    return e[0], msg if end < 0 else msg[:end]


def test_checkpoint_detects_non_determinism():
    """test_checkpoint_detects_non_determinism: a rerun that saves fewer tensors, more (with
    early stop off), or tensors of other metadata raises CheckpointError with torch's
    message and tip; determinism_check="none" and early stop let it through; the reentrant
    form fails where torch's does."""
    def run(T):
        def save_3_tensors(x):
            return x.sin().exp().sin()

        def save_2_tensors(x):
            return x.sin().exp()

        def save_2_tensors_alt(x):
            return x.sin() * T.tensor([1.0, 2.0], dtype=T.float64)

        cp = importlib.import_module(T.__name__ + ".utils.checkpoint")
        return [
            _checkpoint_outcome(T, save_3_tensors, save_2_tensors),
            _checkpoint_outcome(T, save_2_tensors, save_3_tensors, early_stop=False),
            _checkpoint_outcome(T, save_2_tensors, save_3_tensors),
            _checkpoint_outcome(T, save_2_tensors, save_2_tensors_alt),
            _checkpoint_outcome(T, save_2_tensors, save_2_tensors_alt, determinism_check="none"),
            _checkpoint_outcome(T, save_2_tensors, save_2_tensors_alt, use_reentrant=True),
            err_of(cp.checkpoint, save_2_tensors, mk(T, [0.5], rg=True), use_reentrant=False,
                   determinism_check="bogus"),
            issubclass(cp.CheckpointError, RuntimeError),
        ]

    j, t = both(run)
    assert t[0][0] == "CheckpointError" and t[3][1].startswith("torch.utils.checkpoint: Recomputed values")


def test_checkpoint_debug_report():
    """debug=True (or set_checkpoint_debug_enabled(True)): the error opens as torch's
    report, says why it is shown and lists what each run saved. (torch is run once: a
    second debug run in one pytest process raises TypeError from torch's op logging.)"""
    def run(T, how):
        cp = importlib.import_module(T.__name__ + ".utils.checkpoint")

        def first(x):
            return x.sin().exp()

        def then(x):
            return x.sin() * T.tensor([1.0, 2.0], dtype=T.float64)

        a = mk(T, [0.5], rg=True)
        fn = _nondeterministic(first, then)
        if how == "argument":
            e = err_of(lambda: cp.checkpoint(fn, a, use_reentrant=False, debug=True).sum().backward())
        else:
            with cp.set_checkpoint_debug_enabled(True):
                e = err_of(lambda: cp.checkpoint(fn, a, use_reentrant=False).sum().backward())
        msg = e[1]
        return (e[0], msg.splitlines()[:3],
                "You are seeing this error because you passed `debug=True` to checkpoint" in msg,
                "Recomputed values for the following tensors have different metadata" in msg,
                err_of(cp.checkpoint, first, a, use_reentrant=True, debug=True)), msg

    j, t = both(lambda T: run(T, "argument")[0])
    assert run(jitgrad, "global")[0] == j
    msg = run(jitgrad, "global")[1]  # what each run saved (torch logs operators instead)
    assert "$0: f64[1]   (1 of 2 in original)" in msg and "$1: f64[2]   (2 of 2 in recompute)" in msg


# --- more of test_autograd.py's saved-tensor-hooks family, run on both libraries ----------

def _hooks_inner_wins(T):
    """test_setting_default_saved_variable_hooks_twice_should_use_inner"""
    g = T.autograd.graph
    with g.saved_tensors_hooks(lambda x: 3 * x, lambda x: 3 * x):
        b = mk(T, [0.5, -1.0], rg=True)
        with g.saved_tensors_hooks(lambda x: 5 * x, lambda x: 5 * x):
            a = mk(T, [1.5, 2.0], rg=True)
            y = a * a
        z = b * b
    y.sum().backward()
    z.sum().backward()
    return a.grad, b.grad


def _hooks_error_propagation(T):
    """test_saved_tensor_hooks_custom_error_propagation"""
    class CustomError(Exception):
        pass

    def raise_(what):
        raise CustomError(what)

    a = T.tensor(1.0, dtype=T.float64, requires_grad=True)
    with T.autograd.graph.saved_tensors_hooks(lambda x: raise_("pack"), lambda x: x):
        e1 = err_of(T.sin, a)
    with T.autograd.graph.saved_tensors_hooks(lambda x: x, lambda x: raise_("unpack")):
        out = T.sin(a)
        e2 = err_of(out.backward)
    return e1, e2


def _hooks_function_intermediates(T):
    """test_saved_tensor_hooks_custom_function_intermediates"""
    class Func(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            intermediate = x.exp()
            ctx.save_for_backward(intermediate.clone().detach_().requires_grad_(True))
            return x.exp()

        @staticmethod
        def backward(ctx, grad_out):
            (intermediate,) = ctx.saved_tensors
            return grad_out * intermediate

    a = T.tensor(1.0, dtype=T.float64, requires_grad=True)
    with T.autograd.graph.saved_tensors_hooks(lambda x: x, lambda x: x):
        out = Func.apply(a)
    out.backward()
    return a.grad


def _hooks_exec_count(T):
    """test_unpack_hooks_exec_count"""
    counts = [0, 0]

    def pack(x):
        counts[0] += 1
        return x

    def unpack(x):
        counts[1] += 1
        return x

    x = T.ones(4, dtype=T.float64, requires_grad=True)
    y = T.ones(4, dtype=T.float64)
    with T.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = x * y
        seen = [list(counts)]
        out.sum().backward()
    return seen + [list(counts)]


def _hooks_version_counter_not_shared(T):
    """test_saved_tensors_hook_version_counter_not_shared"""
    seen = []

    class Test(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.sin()

        @staticmethod
        def backward(ctx, grad_output):
            (x,) = ctx.saved_tensors
            before = a._version
            x.add_(1)
            seen.append(a._version == before)
            return grad_output

    a = T.tensor(1.0, dtype=T.float64, requires_grad=True)
    a_replacement = a.clone()
    with T.autograd.graph.saved_tensors_hooks(lambda x: a_replacement, lambda x: x):
        b = Test.apply(a)
    b.backward()
    return seen, a.grad


def _save_on_cpu_and_checkpoint(T):
    """test_save_on_cpu_and_checkpoint"""
    cp = importlib.import_module(T.__name__ + ".utils.checkpoint")
    a = mk(T, [[0.5, 1.5], [-1.0, 0.75]], rg=True)
    b = a.pow(2).pow(2).pow(2).pow(2)
    b.sum().backward()
    grads = [a.grad.clone()]
    a.grad = None
    with T.autograd.graph.save_on_cpu():
        h = a.pow(2)
        h = cp.checkpoint(lambda x: x.pow(2).pow(2), h, use_reentrant=False)
        c = h.pow(2)
    c.sum().backward()
    grads.append(a.grad.clone())
    a.grad = None

    def f(a):
        h = a.pow(2)
        with T.autograd.graph.save_on_cpu():
            h = h.pow(2).pow(2)
        return h.pow(2)

    cp.checkpoint(f, a, use_reentrant=False).sum().backward()
    return grads + [a.grad]


def _pack_hook_in_place(T):
    """test_pack_hook_with_inplace_modification_should_fail"""
    a = mk(T, [0.5, 1.0], rg=True)

    def inc(x):
        x += 1
        return x

    with T.autograd.graph.saved_tensors_hooks(inc, lambda x: x):
        e1 = err_of(T.exp, a)
    y = T.exp(a)
    return e1, err_of(y.grad_fn._raw_saved_result.register_hooks, inc, lambda x: x)


def _saving_to_disk(T, tmp_path):
    """test_saving_variable_to_disk"""
    names = iter(range(100))

    def pack(x):
        name = str(tmp_path / f"{T.__name__}-{next(names)}.pt")
        T.save(x, name)
        return name

    with T.autograd.graph.saved_tensors_hooks(pack, lambda name: T.load(name)):
        a = T.ones(5, dtype=T.float64, requires_grad=True)
        y = a * a
        saved = y.grad_fn._saved_self
        y.sum().backward()
    return saved, a.grad


def _hooks_double_backward(T):
    """test_default_saved_tensors_hooks_double_backward"""
    g = T.autograd.graph
    out = []
    base = [0.5, -1.0, 1.5]
    with g.saved_tensors_hooks(lambda x: x, lambda x: x):
        a = mk(T, base, rg=True)
        (gr,) = T.autograd.grad(T.sum(a ** 3), (a,), create_graph=True)
        gr.sum().backward()
        out.append(a.grad)
    with g.saved_tensors_hooks(lambda x: 2 * x, lambda x: x):
        a = mk(T, base, rg=True)
        s = T.sum(a ** 3)
    (gr,) = T.autograd.grad(s, (a,), create_graph=True)
    gr.sum().backward()
    out.append(a.grad)
    a = mk(T, base, rg=True)
    s = T.sum(a ** 3)
    with g.saved_tensors_hooks(lambda x: 2 * x, lambda x: x):
        (gr,) = T.autograd.grad(s, (a,), create_graph=True)
        gr.sum().backward()
    out.append(a.grad)
    with g.saved_tensors_hooks(lambda x: 2 * x, lambda x: x):
        a = mk(T, base, rg=True)
        (gr,) = T.autograd.grad(T.sum(a ** 3), (a,), create_graph=True)
        gr.sum().backward()
    return out + [a.grad]


def _wrapped_number(T):
    """test_wrapped_number_saved_tensors_hooks"""
    def err_hook(x):
        raise RuntimeError("this hook should not be called")

    with T.autograd.graph.saved_tensors_hooks(err_hook, err_hook):
        a = mk(T, [0.5, 1.0], rg=True)
        return T.autograd.grad((a * 3).sum(), (a,))


def _graph_save_on_cpu(T):
    """test_graph_save_on_cpu (dense tensors, both pin_memory settings)"""
    out = []
    for pin_memory in (True, False):
        for dtype in ("float32", "float64"):
            with T.autograd.graph.save_on_cpu(pin_memory):
                a = mk(T, [0.5, -1.0, 2.0], dtype=dtype, rg=True)
                y = a * a
                out += [y.grad_fn._saved_self, y.grad_fn._saved_other, y.grad_fn._saved_self.dtype == a.dtype]
                y.sum().backward()
                out.append(a.grad)
    return out


@pytest.mark.parametrize("scenario", [_hooks_inner_wins, _hooks_error_propagation, _hooks_function_intermediates,
                                      _hooks_exec_count, _hooks_version_counter_not_shared,
                                      _save_on_cpu_and_checkpoint, _pack_hook_in_place, _saving_to_disk,
                                      _hooks_double_backward, _wrapped_number, _graph_save_on_cpu],
                         ids=lambda f: f.__name__.strip("_"))
def test_saved_tensors_hooks_family(scenario, tmp_path):
    if scenario is _saving_to_disk:
        both(lambda T: scenario(T, tmp_path))
    else:
        both(scenario)


# --- more post-accumulate-grad hook tests (test_post_accumulate_grad_hook_*) ----------------

def _post_acc_on_non_leaf(T, cg):
    leaf = mk(T, [0.5, 1.0], rg=True)
    return err_of((2.0 * leaf).register_post_accumulate_grad_hook, lambda t: None)


def _in_place(T, fn):
    """A post-accumulate hook writing its leaf (as optimizers do: under no_grad, which
    create_graph's backward needs; torch's own tests run without it)."""
    def hook(t):
        with T.no_grad():
            fn(t)
    return hook


def _post_acc_multiple_hooks(T, cg):
    t = mk(T, [0.5, 1.0, 1.5], rg=True)
    t.register_post_accumulate_grad_hook(_in_place(T, lambda x: x.sub_(x.grad)))
    t.register_post_accumulate_grad_hook(_in_place(T, lambda x: x.mul_(4.0)))
    _bw(T, t.sum(), cg)
    return t.detach()


def _post_acc_multiple_tensors(T, cg):
    t1 = mk(T, [0.5, 1.0, 1.5], rg=True)
    t2 = mk(T, [2.0, -1.0], rg=True)
    for t in (t1, t2):
        t.register_post_accumulate_grad_hook(_in_place(T, lambda x: x.sub_(x.grad)))
    _bw(T, t1.sum(), cg)
    _bw(T, t2.sum(), cg)
    return t1.detach(), t2.detach()


def _post_acc_returns_not_none(T, cg):
    t = mk(T, [[0.5, 1.0, 1.5], [2.0, -1.0, 0.0]], rg=True)
    t.register_post_accumulate_grad_hook(lambda x: x.grad)
    return err_of(_bw, T, t.sum(), cg)


def _post_acc_ordering(T, cg):
    """tensor pre-hook, AccumulateGrad pre-hook, post-accumulate hook, AccumulateGrad post-hook"""
    t = mk(T, [0.5, 1.0, 1.5], rg=True)
    acc_grad = t.view_as(t).grad_fn.next_functions[0][0]

    def acc_grad_node_post_hook(grad_in, grad_out):
        t.grad = grad_out[0].mul(10)

    t.register_hook(lambda g: g.sub(2.0))
    acc_grad.register_prehook(lambda grad_out: (grad_out[0].div(5.0),))
    t.register_post_accumulate_grad_hook(_in_place(T, lambda x: x.grad.add_(0.5)))
    acc_grad.register_hook(acc_grad_node_post_hook)
    _bw(T, t.sum(), cg)
    return t.grad.detach()


@pytest.mark.parametrize("create_graph", [False, True], ids=["compiled", "python_engine"])
@pytest.mark.parametrize("scenario", [_post_acc_on_non_leaf, _post_acc_multiple_hooks, _post_acc_multiple_tensors,
                                      _post_acc_returns_not_none, _post_acc_ordering],
                         ids=lambda f: f.__name__.strip("_"))
def test_post_accumulate_grad_hooks(scenario, create_graph):
    both(lambda T: scenario(T, create_graph))


def test_anomaly_detect_nan():
    """test_anomaly_detect_nan / test_anomaly_mode_no_check_nan: a NaN a custom Function's
    backward returns goes through silently, raises torch's error naming the node and the
    output in anomaly mode (with the forward's traceback warned when the forward ran in it),
    and passes again with check_nan=False."""
    def run(T):
        size = 4

        class MyFunc(T.autograd.Function):
            @staticmethod
            def forward(ctx, inp1, inp2, fail_0th):
                ctx.fail_0th = fail_0th
                return inp1.sum(0, keepdim=True)

            @staticmethod
            def backward(ctx, gO):
                gI = gO.clone().expand(size)
                gI[0] = 0
                gI[0] /= 0  # a NaN
                return (gI, None, None) if ctx.fail_0th else (None, gI, None)

        def inp():
            return mk(T, [0.25, 0.5, 0.75, 1.0], rg=True)

        out = []
        x = inp()
        MyFunc.apply(x, x, True).backward()
        out.append(bool(T.isnan(x.grad).any()))
        for fail_0th, forward_in_anomaly in ((True, False), (False, False), (False, True)):
            x = inp()
            with pytest.warns(UserWarning) as w:
                with T.autograd.detect_anomaly():
                    o = MyFunc.apply(x, x, fail_0th) if forward_in_anomaly else None
                if o is None:
                    o = MyFunc.apply(x, x, fail_0th)
                with T.autograd.detect_anomaly():
                    out.append(err_of(o.backward))
            out.append([str(m.message).split("\n")[0][:60] for m in w])
        x = inp()
        with T.autograd.set_detect_anomaly(True, check_nan=False):
            MyFunc.apply(x, x, True).backward()
        out.append(bool(T.isnan(x.grad).any()))
        return out

    both(run)


def test_compiled_step_with_hooked_leaves_runs_eagerly_and_keeps_its_plan():
    """jitgrad.compile and the optimizer-in-backward pattern: a call whose recorded plan's
    backward reaches leaves that now have hooks runs eagerly (the hooks run, with eager's
    numbers) and keeps the plan, rather than recording again (which, with the hooks there,
    would give up the plan for good). The optimizer steps change what later calls' guards
    see, so those may record again: they stay eager and right."""
    model = jitgrad.nn.Linear(3, 2).double()
    optims = {p: jitgrad.optim.SGD([p], lr=0.1) for p in model.parameters()}
    twin = copy.deepcopy(model)
    twin_optim = jitgrad.optim.SGD(twin.parameters(), lr=0.1)
    runs = [0]

    def step(x):
        runs[0] += 1
        loss = model(x).sum()
        loss.backward()
        return loss

    def clear():
        for p in model.parameters():
            p.grad = None

    compiled = jitgrad.compile(step)
    x = mk(jitgrad, [[0.1, -0.2, 0.3], [0.4, 0.5, -0.6]])
    compiled(x)
    clear()
    compiled(x)
    clear()
    assert runs[0] == 1  # recorded once, then replayed
    twin(x).sum().backward()  # the twin follows: two backward passes, no step
    twin(x).sum().backward()
    twin.zero_grad()

    def hook(p):
        optims[p].step()
        optims[p].zero_grad()

    handles = [p.register_post_accumulate_grad_hook(hook) for p in model.parameters()]
    entries = list(compiled.cache.values())
    compiled(x)
    assert runs[0] == 2 and list(compiled.cache.values()) == entries  # eager, the plan kept
    twin(x).sum().backward()
    twin_optim.step()
    twin_optim.zero_grad()
    for _ in range(2):
        compiled(x)
        twin(x).sum().backward()
        twin_optim.step()
        twin_optim.zero_grad()
    assert runs[0] == 4
    assert all(a.tolist() == b.tolist() for a, b in zip(model.parameters(), twin.parameters()))
    for h in handles:
        h.remove()
