"""Forward-mode AD: each primitive's tangent, computed as its forward runs.

A tangent is a Tensor kept on its primal (Tensor._fw, set by make_dual or by an op here)
while a dual level is open (_core/forward.py). After a primitive's forward, if any input
has a tangent, the output's tangent is computed from the primitive's entry
(graph/spec.py):

- elementwise entries need no forward formula: their Jacobian is diagonal, so the JVP
  is the sum over inputs of the VJP formula with `grad` read as that input's tangent
  (broadcast to the output's shape), e.g. mul: t_self * other + t_other * self.
- structural entries give `jvp(ci, tangents) -> tangent`: `ci` is a CallInfo (the same
  reading API as a rule's RowInfo: iparams(), floats(), in_shape(), saved_named()...)
  and tangents has one Tensor or None per input. Linear ops apply themselves to the
  tangent; others write derivatives.yaml's `result:` formula.

The formulas are ordinary Tensor ops, run with forward mode paused (state.live False)
so they compute primal values only. If the primal or the tangent requires grad, those
ops record like any other, which is what makes reverse-over-forward work; and saved
values read back by a create_graph backward find their tangents (graph.tensor.linked),
which is what makes forward-over-reverse (Hessian-vector products) work.
"""
import weakref

import numpy as np

from jitgrad._core.forward import state as _fw
from jitgrad._core.modes import _state as _gm_state
from jitgrad.gpu.array import DeviceArray
from jitgrad.graph import record as _record
from jitgrad.graph.tensor import Tensor, wrap

NS = {}  # the formula functions (spec.FUNCS): filled by ops/__init__ once the families exist


def tangent(t):
    """t's tangent at the open dual level, or None."""
    x = t._x
    return None if x is None else x.fw


def set_tangent(t, tg):
    """Give t the tangent tg; a tensor with a row also registers it under that row, for a
    create_graph backward that reads t back as a saved value."""
    t._fw = tg
    holders = _fw.holders
    holders.append(weakref.ref(t))
    if len(holders) >= _fw.compact_at:
        holders[:] = [r for r in holders if r() is not None]
        _fw.compact_at = 2 * len(holders) + 1024
    tape = t._tape
    if tape is not None:
        rows = _fw.by_tape.get(tape)
        if rows is None:
            rows = _fw.by_tape[tape] = {}
        rows[(t._row, t._output_nr)] = tg
    return t


def _note_constant_inputs(res, inputs):
    """A create_graph backward reads a saved input that does not require grad back as a
    plain array (graph/rowinfo.RowInfo.input): keep its tangent under the row too, keyed
    (row, -1 - j), for forward-over-reverse through it."""
    tape = res._tape
    if tape is None or not res._requires_grad:
        return
    for j, t in enumerate(inputs):
        if isinstance(t, Tensor) and not t._requires_grad:
            tg = tangent(t)
            if tg is not None:
                rows = _fw.by_tape.get(tape)
                if rows is None:
                    rows = _fw.by_tape[tape] = {}
                rows[(res._row, -1 - j)] = tg


def not_implemented(name):
    return NotImplementedError(f"Trying to use forward AD with {name} that does not support it because it has not "
                               "been implemented yet.\nPlease file an issue to PyTorch at "
                               "https://github.com/pytorch/pytorch/issues/new?template=feature-request.yml so that "
                               "we can prioritize its implementation.")


def _fit(tg, like):
    """A contribution at the output's shape and dtype (broadcast inputs, promoted dtypes)."""
    d = like._data
    if tg._data.dtype != d.dtype:
        tg = tg.to(like.dtype)
    if tg._data.shape != d.shape:
        tg = tg.expand(like.shape)
    return tg


class _Paused:
    """Forward mode off while a JVP formula runs: its ops must not compute tangents of
    their own (the tangent formula of a tangent formula)."""
    __slots__ = ()

    def __enter__(self):
        _fw.live = False

    def __exit__(self, *exc):
        _fw.live = _fw.level >= 0


_paused = _Paused()


# --- elementwise: the VJP formula with grad := the input's tangent -------------------------------
def ew(record_ew, spec, out, a, b, p0, p1, aux):
    """ops/elementwise._ew while forward mode is live: record as usual (record_ew is _ew
    itself, told not to come back here), then the output's tangent."""
    res = record_ew(spec, out, a, b, p0, p1, aux, False)
    ta = tangent(a)
    tb = tangent(b) if isinstance(b, Tensor) else None
    if ta is None and tb is None:
        return res
    _note_constant_inputs(res, (a, b))
    codes = spec.code()
    with _paused:
        ns = dict(NS)
        ns["p0"], ns["p1"] = p0, p1
        for name, src in zip(spec.saves, spec.save_src):
            ns[name] = a if src == 0 else b if src == 1 else res if src == -1 else aux
        total = None
        for code, tg in zip(codes, (ta, tb)):
            if tg is None:
                continue
            if code is None:
                continue  # not differentiable in this input (e.g. where's condition)
            ns["grad"] = tg
            part = eval(code, ns)
            total = part if total is None else total + part
        if total is None:
            return res
        own = total is ta or total is tb  # a formula that is `grad` itself (clone, add of a constant)
        total = _fit(total, res)
        if own:
            total = total.clone()
    return set_tangent(res, total)


# --- structural: the entry's jvp ----------------------------------------------------------------
class CallInfo:
    """What a jvp formula reads about its call: the same methods a rule's RowInfo has,
    answered from the forward's own values instead of a tape row."""
    __slots__ = ("_spec", "inputs", "result", "_saved", "_fparams", "_iparams")

    def __init__(self, spec, inputs, result, saved, fparams, iparams):
        self._spec, self.inputs, self.result = spec, inputs, result
        self._saved, self._fparams, self._iparams = saved, fparams, iparams

    def spec(self):
        return self._spec

    def n_inputs(self):
        return len(self.inputs)

    def in_shape(self, j):
        return tuple(self.inputs[j]._data.shape)

    def out_shape(self):
        return tuple(self.result._data.shape)

    def ints(self):
        return list(self._iparams or ())

    def iparams(self):
        return self._spec.read_ints(self.ints())

    def floats(self, n):
        return list(self._fparams[:n])

    def input(self, j):
        return self.inputs[j]

    def saved_named(self, name):
        """An argument reads back as that input, "result" as the output, others as the
        saved array (an index, a mask...)."""
        spec = self._spec
        j = spec.input_of(name)
        if j is not None:
            return self.inputs[j]
        if name == "result":
            return self.result
        return wrap(self._saved[spec.saves.index(name)])


def record(spec, result, inputs, saved, fparams, iparams):
    """graph/record.record while forward mode is live: record the row when the backward
    needs it, then give the output the tangent of the entry's jvp."""
    if _gm_state.enabled:
        for t in inputs:
            if t._requires_grad:
                result = _record.record(spec, result, inputs, saved, fparams, iparams, dual=False)
                break
    tangents = [tangent(t) for t in inputs]
    if all(tg is None for tg in tangents):
        return result
    _note_constant_inputs(result, inputs)
    if spec.jvp is None:
        raise not_implemented(spec.node_name[:-len("Backward0")] if spec.node_name.endswith("Backward0")
                              else spec.name)
    with _paused:
        tg = spec.jvp(CallInfo(spec, inputs, result, saved, fparams, iparams), tangents)
        if tg is None:
            return result
        tg = _fit(tg, result)
        if _aliases(tg, tangents) and not _aliases(result, inputs):
            tg = tg.clone()
    return set_tangent(result, tg)


def _aliases(t, others):
    """Whether t's array may share memory with one of others' (a bounds check, O(1)).

    The tangent of a view is a view of its base's tangent, so that an in-place op on either
    reaches the other, as in PyTorch; any other result gets a tangent of its own, or an
    in-place op on it would change its input's tangent too (a jvp that is the input's
    tangent, or a reshape of it, as sum over a size-1 dim gives)."""
    d = t._data
    if type(d) is not np.ndarray:
        if type(d) is DeviceArray:
            return any(o is not None and type(o._data) is DeviceArray and o._data.buf is d.buf for o in others)
        return False  # a numpy scalar (a 0-d result) shares nothing
    return any(o is not None and type(o._data) is np.ndarray and np.may_share_memory(d, o._data) for o in others)


_fw.record = record
