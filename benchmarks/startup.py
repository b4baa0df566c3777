#!/usr/bin/env python
"""Start-up, measured the way a new user meets it: every number is a fresh process.

    python benchmarks/startup.py [--quick] [--baseline PATH] [--repo PATH] [--json out.json]

Rows (issue 14's targets):
* warm start: `import jitgrad` and the first backward of a scalar graph of five
  primitives (mul, add, exp, sin, tanh) once the caches are full; beside it torch running
  the same script, and numba's own share: `import numpy, numba` and the first call of a
  trivial cached @njit function (numba sets up its compiler's registries at the first
  call of any compiled function, loaded from the cache or not), with SciPy's BLAS
  loaded as jitgrad loads it (jitgrad/kernels/_scipyblas.py). --baseline PATH adds the
  same row for another checkout (e.g. a copy of main). The warm rows take turns, so
  the machine's load falls on all of them alike, and each reports its best run;
* cold scalar backward: that script with empty caches (fresh NUMBA_CACHE_DIR and
  JITGRAD_CACHE_DIR);
* cold digits MLP: `import jitgrad`, the digits MLP (64-128-128-10, batch 32, Adam,
  cross-entropy; jitgrad/examples/digits.py builds it) and one training step, empty
  caches; torch beside it;
* CI warm-up: `python -m jitgrad.warmup`'s work (float64 and float32), empty caches.

A child times itself from before its first import to the end of its work (the seconds
the targets apply to, split into the import and the rest), and counts the CPU seconds of
the same span (every thread's: on a busy machine the steadier number for comparing two
checkouts); the parent's wall time of the whole child, interpreter start and exit
included, is beside them. The children import the
checkout this file lives in (or --repo's), not an installed jitgrad.

Python's bytecode cache counts as part of the installation, not as one of jitgrad's
caches: `pip install` writes it. So the checkout's .pyc files are written first
(compileall) and the children use them even where PYTHONDONTWRITEBYTECODE is set (without
them every fresh process compiles jitgrad's source again, about 0.3 s more on this
machine). --no-bytecode skips that and lets the children write none: it measures a
checkout without .pyc files only if it has none yet (a fresh clone on a machine that sets
PYTHONDONTWRITEBYTECODE=1, as this one does), since Python still reads those it finds.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# a child prints, on its last line, the seconds of its import and of the rest, and the CPU
# seconds of both (less disturbed by other processes on a busy machine than the clock)
_CLOCK = "import time\nt0, c0 = time.perf_counter(), time.process_time()\nimport {lib} as T\nt1 = time.perf_counter()\n"
_DONE = "\nt2 = time.perf_counter()\nprint(t1 - t0, t2 - t1, time.process_time() - c0)\n"

SCALAR = _CLOCK + """\
x = T.tensor(0.7, requires_grad=True)
y = T.tanh(T.sin(T.exp(x * 1.5) + x))
y.backward()
assert x.grad is not None
""" + _DONE

# digits.py is loaded by path: importing jitgrad.examples would import jitgrad into torch's run
MLP = _CLOCK + """\
import importlib.util
import numpy as np
spec = importlib.util.spec_from_file_location("digits", {digits!r})
digits = importlib.util.module_from_spec(spec)
spec.loader.exec_module(digits)
build_mlp, initial_weights, train_step = digits.build_mlp, digits.initial_weights, digits.train_step
model = build_mlp(T, initial_weights([64, 128, 128, 10]))
step = train_step(model, T.optim.Adam(model.parameters(), lr=1e-3), T.nn.CrossEntropyLoss())
rng = np.random.default_rng(0)
loss = step(T.tensor(rng.random((32, 64), dtype=np.float32)), T.tensor(rng.integers(0, 10, 32)))
assert model[0].weight.grad is not None and float(loss) == float(loss)
""" + _DONE

WARMUP = _CLOCK.format(lib="jitgrad.warmup") + "T.warmup(verbose=False)\n" + _DONE

# numba's own start-up as jitgrad meets it (SciPy's BLAS preloaded as jitgrad.kernels does,
# where the checkout has kernels/_scipyblas.py); the module is written into the child's
# directory first
NUMBA_FLOOR = _CLOCK.format(lib="numpy, numba") + """\
import importlib.util, os
if os.path.exists({scipyblas!r}):
    spec = importlib.util.spec_from_file_location("startup_scipyblas", {scipyblas!r})
    preload = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(preload)
    preload.preload()
import startup_floor_module
startup_floor_module.f(1.0)
""" + _DONE
FLOOR_MODULE = "from numba import njit\n\n\n@njit(cache=True)\ndef f(x):\n    return x + 1.0\n"

# (seconds) issue 14
TARGETS = {"cold digits MLP": 5.0, "cold scalar backward": 3.0, "warm start": 0.5, "CI warm-up": 15.0}


class Child:
    """One kind of fresh process: its script, the checkout it imports, its own caches."""

    def __init__(self, what, lib, code, repo, bytecode, tmp):
        self.what, self.lib = what, lib
        self.code = (code.replace("{lib}", lib)
                     .replace("{digits!r}", repr(os.path.join(repo, "jitgrad", "examples", "digits.py")))
                     .replace("{scipyblas!r}", repr(os.path.join(repo, "jitgrad", "kernels", "_scipyblas.py"))))
        self.dir = tempfile.mkdtemp(prefix="jitgrad-startup-", dir=tmp)
        env = dict(os.environ)
        env["NUMBA_CACHE_DIR"] = os.path.join(self.dir, "numba")
        env["JITGRAD_CACHE_DIR"] = os.path.join(self.dir, "jitgrad")
        env["PYTHONPATH"] = os.pathsep.join([repo, self.dir] + [p for p in [env.get("PYTHONPATH")] if p])
        env.pop("NUMBA_DISABLE_JIT", None)
        env.pop("NUMBA_ENABLE_CUDASIM", None)  # a user's CPU process: numba.cuda's simulator is a test setting
        if bytecode:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
        else:
            env["PYTHONDONTWRITEBYTECODE"] = "1"
        self.env = env
        with open(os.path.join(self.dir, "startup_floor_module.py"), "w") as f:
            f.write(FLOOR_MODULE)
        self.best = None

    def empty_caches(self):
        for sub in ("numba", "jitgrad"):
            subprocess.run(["rm", "-rf", os.path.join(self.dir, sub)], check=True)

    def run(self):
        """One fresh process (cwd: its own directory, so jitgrad comes from PYTHONPATH);
        keeps the best (wall, import, rest) so far."""
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", self.code], env=self.env, capture_output=True, text=True,
                              cwd=self.dir)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"start-up child ({self.what}, {self.lib}) failed:\n{proc.stderr[-4000:]}")
        imp, rest, cpu = (float(v) for v in proc.stdout.strip().splitlines()[-1].split())
        if self.best is None or imp + rest < self.best[1] + self.best[2]:
            self.best = (wall, imp, rest, cpu)
        self.cpu = min(cpu, getattr(self, "cpu", cpu))

    def row(self, label=None):
        wall, imp, rest, _ = self.best
        target = TARGETS.get(self.what) if self.lib == "jitgrad" and label is None else None
        row = {"what": self.what, "lib": label or self.lib, "in_process_s": imp + rest, "import_s": imp,
               "work_s": rest, "wall_s": wall, "cpu_s": self.cpu, "target_s": target,
               "met": None if target is None else imp + rest <= target}
        print(f"  {row['lib']:10} {self.what:22} {imp + rest:7.3f} s  (import {imp:.3f}, rest {rest:.3f}; "
              f"wall {wall:.3f}, cpu {self.cpu:.3f})", file=sys.stderr, flush=True)
        return row


def warm_rows(children, repeats):
    """Fill each child's caches with one run, then `repeats` rounds, the children in turn."""
    for c in children:
        c.run()
        c.best = None
    for _ in range(repeats):
        for c in children:
            c.run()


def cold_row(child, repeats):
    for _ in range(repeats):
        child.empty_caches()
        child.run()
    return child.row()


def compile_bytecode(repo):
    """The .pyc files `pip install` would have written for the checkout's package."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(repo, "jitgrad")], check=True,
                   env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"})


def run(repo, baseline=None, bytecode=True, warm_repeats=5, cold_repeats=1, quick=False):
    with tempfile.TemporaryDirectory(prefix="jitgrad-startup-") as tmp:
        for r in [repo] + ([baseline] if baseline else []):
            if bytecode:
                compile_bytecode(r)
        warm = [Child("warm start", "jitgrad", SCALAR, repo, bytecode, tmp),
                Child("warm start", "torch", SCALAR, repo, bytecode, tmp),
                Child("warm start", "numba", NUMBA_FLOOR, repo, bytecode, tmp)]
        if baseline:
            warm.append(Child("warm start", "jitgrad", SCALAR, baseline, bytecode, tmp))
        warm_rows(warm, warm_repeats)
        rows = [c.row() for c in warm[:3]] + ([warm[3].row("baseline")] if baseline else [])
        if not quick:
            rows += [cold_row(Child("cold scalar backward", "jitgrad", SCALAR, repo, bytecode, tmp), cold_repeats),
                     cold_row(Child("cold digits MLP", "jitgrad", MLP, repo, bytecode, tmp), cold_repeats),
                     cold_row(Child("cold digits MLP", "torch", MLP, repo, bytecode, tmp), cold_repeats),
                     cold_row(Child("CI warm-up", "jitgrad", WARMUP, repo, bytecode, tmp), cold_repeats)]
    return rows


def import_breakdown(repo, bytecode, repeats):
    """{owner: ms}: `import jitgrad`'s time by who spends it (python -X importtime's self
    times, the best of `repeats` fresh processes per module), owners being jitgrad's
    layers and the third-party packages."""
    child = Child("import", "jitgrad", "import jitgrad\n", repo, bytecode, None)
    best = {}
    for _ in range(repeats):
        proc = subprocess.run([sys.executable, "-X", "importtime", "-c", child.code], env=child.env,
                              capture_output=True, text=True, cwd=child.dir)
        for line in proc.stderr.splitlines():
            parts = line.split("|")
            if len(parts) == 3 and parts[0].startswith("import time:") and parts[0].split()[-1].isdigit():
                name = parts[2].strip()
                best[name] = min(best.get(name, 1e18), int(parts[0].split()[-1]))
    shutil.rmtree(child.dir, ignore_errors=True)
    owners = {}
    for name, us in best.items():
        top = name.split(".")
        owner = ".".join(top[:2]) if top[0] == "jitgrad" and len(top) > 1 else top[0]
        owner = {"llvmlite": "numba"}.get(owner, owner)
        owners[owner] = owners.get(owner, 0) + us / 1000
    return dict(sorted(owners.items(), key=lambda kv: -kv[1]))


def report(rows):
    print(f"{'what':<24}{'lib':<10}{'seconds':>9}{'import':>9}{'cpu':>9}{'wall':>9}{'target':>9}  met?")
    for r in rows:
        target = "" if r["target_s"] is None else f"{r['target_s']:.1f}"
        met = "" if r["met"] is None else ("yes" if r["met"] else "NO")
        print(f"{r['what']:<24}{r['lib']:<10}{r['in_process_s']:>9.3f}{r['import_s']:>9.3f}{r['cpu_s']:>9.3f}"
              f"{r['wall_s']:>9.3f}{target:>9}  {met}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="the warm rows only (seconds, not minutes)")
    p.add_argument("--repo", default=ROOT, help="the checkout whose jitgrad the children import")
    p.add_argument("--baseline", help="another checkout whose warm start is measured in turn with --repo's")
    p.add_argument("--no-bytecode", action="store_true", help="write no .pyc (see the docstring: existing ones are still read)")
    p.add_argument("--repeats", type=int, default=7, help="rounds of the warm rows (each reports its best)")
    p.add_argument("--cold-repeats", type=int, default=1, help="fresh processes per cold row (the best is reported)")
    p.add_argument("--breakdown", action="store_true",
                   help="only: import jitgrad's milliseconds by package (python -X importtime, warm)")
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args(argv)
    if args.breakdown:
        if not args.no_bytecode:
            compile_bytecode(os.path.abspath(args.repo))
        owners = import_breakdown(os.path.abspath(args.repo), not args.no_bytecode, args.repeats)
        print(f"import jitgrad, {sum(owners.values()):.0f} ms (sum of self times; -X importtime adds its own):")
        for owner, ms in owners.items():
            if ms >= 1:
                print(f"{ms:8.1f}  {owner}")
        return
    rows = run(os.path.abspath(args.repo), args.baseline and os.path.abspath(args.baseline), not args.no_bytecode,
               args.repeats, args.cold_repeats, args.quick)
    report(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
