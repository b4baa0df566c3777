"""The real-program benchmark rows (benchmarks/real_programs.py, issue 27) at a step or two:
torchdiffeq's ode_demo (odeint and odeint_adjoint, jitgrad through the import shim) and the
small nanoGPT train as torch does from the same weights and batches, go through
side_by_side.py's check, timing and report code, and a row whose losses disagree fails.
Timing is side_by_side.py's business; here only that the rows keep working."""
import importlib.util
import sys

import numpy as np
import pytest
from conftest import ROOT

import jitgrad
from jitgrad import as_torch

torch = pytest.importorskip("torch")

if ROOT not in sys.path:            # the benchmarks package, as asv and side_by_side.py import it
    sys.path.insert(0, ROOT)
from benchmarks import bench_training, real_programs, side_by_side  # noqa: E402

HAVE_TORCHDIFFEQ = importlib.util.find_spec("torchdiffeq") is not None
ODE_KEYS = [k for k in real_programs.ROWS if k[0] == "ode_demo"]


@pytest.fixture(scope="module")
def programs():
    return real_programs.Programs(jitgrad, torch)


@pytest.mark.skipif(not HAVE_TORCHDIFFEQ, reason="torchdiffeq is not installed")
def test_torchdiffeq_is_imported_once_per_library_and_sys_modules_is_left_alone(programs):
    before = {k: m for k, m in sys.modules.items() if k.startswith("torchdiffeq")}
    jg, tq = programs.tdq["jitgrad"], programs.tdq["torch"]
    assert jg is not tq
    assert sys.modules["torch"] is torch and not as_torch.is_installed()
    bound = {lib: m.odeint.__globals__["torch"] for lib, m in programs.tdq.items()}   # odeint's module's torch
    assert bound["torch"] is torch
    assert bound["jitgrad"].__version__ == "2.13.0+jitgrad" and bound["jitgrad"].Tensor is jitgrad.Tensor
    real_programs.import_torchdiffeq(jitgrad)
    assert {k: m for k, m in sys.modules.items() if k.startswith("torchdiffeq")} == before


def test_without_torchdiffeq_the_ode_rows_say_so(monkeypatch):
    monkeypatch.setattr(real_programs, "import_torchdiffeq", lambda jitgrad=None: None)
    p = real_programs.Programs(jitgrad, torch)
    assert [p.skipped(k) for k in real_programs.ROWS] == [real_programs.TORCHDIFFEQ_MISSING] * 2 + [None]
    rows = side_by_side.real_comparisons(p, list(real_programs.ROWS), side_by_side.REAL_STEPS_QUICK, {})
    assert [r["skipped"] for r in rows] == [real_programs.TORCHDIFFEQ_MISSING] * 2 + [None]
    assert "pip install --no-deps torchdiffeq==0.2.5" in rows[0]["skipped"]


def test_real_program_losses_agree_and_rows_time_through_side_by_side(programs):
    keys = list(real_programs.ROWS) if HAVE_TORCHDIFFEQ else [("small GPT", "step")]
    problems, disagree = side_by_side.check_real(programs, keys)
    assert problems == [] and disagree == {}
    # the losses are the models' own: they move from step to step, the GPT starts near log(65)
    gpt = programs.losses(("small GPT", "step"), "jitgrad", 3)
    assert abs(gpt[0] - np.log(65)) < 0.1 and len(set(gpt)) == 3
    rows = side_by_side.real_comparisons(programs, keys, dict.fromkeys(keys, 1), {})
    results = {"timings": [], "memory": [], "startup": [], "agreement_problems": []}
    for r in rows:
        res = side_by_side.measure_phase(r["sides"], warmup=0, repeats=1, min_time=0, max_wall=0)
        assert set(res) == {"jitgrad", "torch"} and all(t > 0 for t in res.values())
        assert r["target"] == side_by_side.TIME_TARGETS[r["key"]]
        results["timings"].append({"workload": r["key"][0], "phase": r["key"][1], "vs": "torch",
                                   "target": r["target"], "jitgrad_s": res["jitgrad"], "ref_s": res["torch"],
                                   "ratio": res["jitgrad"] / res["torch"], "pass": None, "note": r["note"]()})
    side_by_side.print_report(results)


def test_disagreeing_losses_fail_the_row(programs):
    key = ("small GPT", "step")

    class Off(real_programs.Programs):
        def losses(self, key, lib, steps):
            out = super().losses(key, lib, steps)
            return [v * (1.001 if lib == "jitgrad" else 1.0) for v in out]

    off = Off.__new__(Off)
    off.__dict__.update(programs.__dict__)
    problems, disagree = side_by_side.check_real(off, [key])
    assert len(problems) == 1 and "small GPT step: losses disagree" in problems[0] and key in disagree
    rows = side_by_side.real_comparisons(off, [key], {key: 1}, disagree)
    timed = side_by_side.run_timings({"jitgrad": jitgrad, "torch": torch}, 0, 1, 0, 0, only=["small GPT step"],
                                     real=rows)
    assert [(r["workload"], r["phase"], r["pass"]) for r in timed] == [("small GPT", "step", False)]
    assert timed[0]["note"].startswith("losses disagree")


def test_asv_benchmarks_run_jitgrad_alone():
    bench = bench_training.SmallGPTSteps()
    bench.steps = 2
    bench.setup()
    bench.time_steps()
    if HAVE_TORCHDIFFEQ:
        ode = bench_training.ODEDemoSteps()
        ode.steps = 1
        ode.setup("odeint_adjoint")
        ode.time_steps("odeint_adjoint")
