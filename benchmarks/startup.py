#!/usr/bin/env python
"""Start-up, measured the way a new user meets it: every number is a fresh process.

    python benchmarks/startup.py [--quick] [--repo PATH] [--json out.json]

Rows (issue 14's targets):
* cold digits MLP: `import jitgrad`, the digits MLP (64-128-128-10, batch 32, Adam,
  cross-entropy; jitgrad/examples/digits.py builds it) and one training step, with
  empty caches (fresh NUMBA_CACHE_DIR and JITGRAD_CACHE_DIR);
* cold scalar backward: `import jitgrad` and the first backward of a scalar graph of
  five primitives (mul, add, exp, sin, tanh), empty caches;
* warm start: the same scalar script once its caches are full (min of several runs),
  with torch's import + first backward of the same script beside it;
* CI warm-up: `python -m jitgrad.warmup` (float64 and float32), empty caches.

A child times itself from before `import` to the end of its work (the "in-process"
column, which the targets apply to); the parent's wall time of the whole child,
interpreter start included, is beside it. The children import the checkout this file
lives in (or --repo's), not an installed jitgrad.

Python's own bytecode cache is treated as part of the installation, not of jitgrad's
caches: `pip install` writes it, so the checkout's .pyc files are written first
(compileall) and the children may use them even where PYTHONDONTWRITEBYTECODE is set
(without .pyc files every import compiles jitgrad's source again: about 0.3 s more).
--no-bytecode measures that case instead.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# what the child prints on its last line: seconds for the import, then for the rest
_CLOCK = "import time\nt0 = time.perf_counter()\nimport {lib} as T\nt1 = time.perf_counter()\n"
_DONE = "\nt2 = time.perf_counter()\nprint(t1 - t0, t2 - t1)\n"

SCALAR = _CLOCK + """\
x = T.tensor(0.7, requires_grad=True)
y = T.tanh(T.sin(T.exp(x * 1.5) + x))
y.backward()
assert x.grad is not None
""" + _DONE

MLP = _CLOCK + """\
import numpy as np
from jitgrad.examples.digits import build_mlp, initial_weights, train_step
model = build_mlp(T, initial_weights([64, 128, 128, 10]))
step = train_step(model, T.optim.Adam(model.parameters(), lr=1e-3), T.nn.CrossEntropyLoss())
rng = np.random.default_rng(0)
loss = step(T.tensor(rng.random((32, 64), dtype=np.float32)), T.tensor(rng.integers(0, 10, 32)))
assert model[0].weight.grad is not None and float(loss) == float(loss)
""" + _DONE

WARMUP = _CLOCK.format(lib="jitgrad.warmup") + """\
T.warmup(verbose=False)
""" + _DONE

# (seconds) issue 14
TARGETS = {"cold digits MLP": 5.0, "cold scalar backward": 3.0, "warm start": 0.5, "CI warm-up": 15.0}


def child_env(cache_dir, repo, bytecode):
    env = dict(os.environ)
    env["NUMBA_CACHE_DIR"] = os.path.join(cache_dir, "numba")
    env["JITGRAD_CACHE_DIR"] = os.path.join(cache_dir, "jitgrad")
    env["PYTHONPATH"] = os.pathsep.join([repo] + [p for p in [env.get("PYTHONPATH")] if p])
    env.pop("NUMBA_DISABLE_JIT", None)
    env.pop("NUMBA_ENABLE_CUDASIM", None)  # a user's CPU process: numba.cuda's simulator is a test setting
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def run_child(code, env, cwd):
    """(wall seconds of the child, its own (import, rest) seconds)."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=cwd)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"start-up child failed:\n{code}\n{proc.stderr[-4000:]}")
    imp, rest = (float(v) for v in proc.stdout.strip().splitlines()[-1].split())
    return wall, imp, rest


def measure(what, code, repo, bytecode, repeats=1, warm=False, lib="jitgrad"):
    """The min over `repeats` fresh processes, each on empty caches, or (warm) on caches
    filled by one run before."""
    best = None
    with tempfile.TemporaryDirectory(prefix="jitgrad-startup-") as d:
        env = child_env(d, repo, bytecode)
        if warm:
            run_child(code.format(lib=lib), env, d)
        for _ in range(repeats):
            if not warm and best is not None:   # cold again: empty the caches
                for sub in ("numba", "jitgrad"):
                    subprocess.run(["rm", "-rf", os.path.join(d, sub)], check=True)
            r = run_child(code.format(lib=lib), env, d)  # cwd d: jitgrad comes from PYTHONPATH
            best = r if best is None or r[1] + r[2] < best[1] + best[2] else best
    wall, imp, rest = best
    target = TARGETS.get(what) if lib == "jitgrad" else None
    row = {"what": what, "lib": lib, "in_process_s": imp + rest, "import_s": imp, "work_s": rest,
           "wall_s": wall, "target_s": target, "met": None if target is None else imp + rest <= target}
    print(f"  {lib:8} {what:22} {imp + rest:7.3f} s  (import {imp:.3f}, rest {rest:.3f}; wall {wall:.3f})",
          file=sys.stderr, flush=True)
    return row


def compile_bytecode(repo):
    """The .pyc files `pip install` would have written for the checkout's package."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(repo, "jitgrad")], check=True,
                   env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"})


def run(repo, bytecode=True, warm_repeats=5, cold_repeats=1, quick=False):
    if bytecode:
        compile_bytecode(repo)
    rows = [measure("warm start", SCALAR, repo, bytecode, warm_repeats, warm=True),
            measure("warm start", SCALAR, repo, bytecode, warm_repeats, warm=True, lib="torch")]
    if not quick:
        rows += [measure("cold scalar backward", SCALAR, repo, bytecode, cold_repeats),
                 measure("cold digits MLP", MLP, repo, bytecode, cold_repeats),
                 measure("cold digits MLP", MLP, repo, bytecode, warm_repeats, lib="torch"),
                 measure("CI warm-up", WARMUP, repo, bytecode, cold_repeats)]
    return rows


def report(rows):
    print(f"{'what':<24}{'lib':<9}{'seconds':>9}{'import':>9}{'wall':>9}{'target':>9}  met?")
    for r in rows:
        target = "" if r["target_s"] is None else f"{r['target_s']:.1f}"
        met = "" if r["met"] is None else ("yes" if r["met"] else "NO")
        print(f"{r['what']:<24}{r['lib']:<9}{r['in_process_s']:>9.3f}{r['import_s']:>9.3f}{r['wall_s']:>9.3f}"
              f"{target:>9}  {met}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="the warm rows only (seconds, not minutes)")
    p.add_argument("--repo", default=ROOT, help="the checkout whose jitgrad the children import")
    p.add_argument("--no-bytecode", action="store_true", help="children compile every module's source (no .pyc)")
    p.add_argument("--repeats", type=int, default=5, help="fresh processes per warm row (the min is reported)")
    p.add_argument("--cold-repeats", type=int, default=1, help="fresh processes per cold row (the min is reported)")
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args(argv)
    rows = run(os.path.abspath(args.repo), not args.no_bytecode, args.repeats, args.cold_repeats, args.quick)
    report(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
