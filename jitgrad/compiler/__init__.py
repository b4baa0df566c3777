"""jitgrad.compile: record a step once, replay it from flat arrays (see api.py).

  recorder.py  the first call, run eagerly, written down as values, instructions, events
  plan.py      that recording lowered to arrays: the forward program, the backward's tape
               copy with its saved values pointed into the arena, the events in order
  replay.py    a later call: arguments in, the compiled forward, the compiled backward,
               the optimizer's step, outputs out
  api.py       compile(), the per-signature cache and its guards, explain()
"""
from jitgrad.compiler.api import CompiledFunction, ExplainOutput, GraphBreak, OptimizedModule, compile, config, explain

__all__ = ["CompiledFunction", "ExplainOutput", "GraphBreak", "OptimizedModule", "compile", "config", "explain"]
