"""jitgrad.compile's recording switch.

While a compiled function records its first call (jitgrad/compiler/recorder.py), every
op reports what it did here: the ops layer and graph/record.py read `state.on` once per
op, so outside a recording this costs one attribute read and nothing else. `state.rec`
is the active Recorder; it is only ever set by the thread that records, and the switch
is off again (for that thread's ops) while the recorder itself runs eager code that must
not be traced: the eager backward, the optimizer's step, zero_grad.

The hooks are:
  rec.ew(spec, result, a, b, p0, p1, aux)        an elementwise primitive (ops/elementwise._ew)
  rec.struct(spec, result, inputs, saved, fparams, iparams, extra=())
                                                 a structural primitive (graph/record.record
                                                 when grad is recorded; the op itself otherwise)
  rec.python(fn, inputs, outputs, name)          an op replayed by calling fn(*input arrays) ->
                                                 output arrays (comparisons, random draws...)
  rec.constant(t)                                a tensor made from Python values in the step
  rec.stop(reason)                               something that cannot be replayed (a graph break)
"""
import threading


class _State:
    on = False
    rec = None

    def mine(self):
        """Whether the calling thread is the one recording: other threads' ops go on as
        usual, untraced (the switch is process-wide; one attribute read per op is the cost
        of having it at all)."""
        rec = self.rec
        return rec is not None and rec.thread == threading.get_ident()


state = _State()

# Bumped by every change to what a module holds (its attributes, parameters, buffers,
# submodules, forward hooks: nn/module.py): a compiled function's plan looks again at the
# modules it read only when this has moved since it last did (compiler/guards.py).
generation = [0]


def stop(reason):
    """Report a graph break (no-op outside a recording)."""
    if state.on and state.mine():
        state.rec.stop(reason)
