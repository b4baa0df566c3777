"""Forward-mode AD's global state: the dual level, and whether any tangent is alive.

The forward of every op reads `state.live` once (ops/_common._needs, ops/elementwise._ew,
graph/record.record): while it is False, which is always outside a dual level, forward
mode costs nothing else. It is also False while a JVP formula runs, so that the formula's
own ops compute primal values only. It is True from the first make_dual of a level to its exit.

Like PyTorch, one level exists at a time (a second one raises "Nested forward mode AD is
not supported at the moment"), and the level is process-wide, not per thread.
"""
import weakref


class _State:
    level = -1        # the open dual level, -1: none
    live = False      # a tangent exists at the open level: ops compute tangents
    # tangents of tensors that are read back from a tape row (create_graph backward reads
    # saved values as new Tensor objects): tape -> {(row, output_nr): tangent}; weak, so
    # they go with the tape
    by_tape = weakref.WeakKeyDictionary()
    # the ops layer's handler of a structural op's forward (ops/_forward.record): graph/
    # record.record hands over to it while live
    record = None
    # every tensor given a tangent at this level (weak): their tangents go at exit; dead
    # references are dropped when the list doubles
    holders = []
    compact_at = 1024


state = _State()
