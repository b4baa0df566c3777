#!/usr/bin/env python
"""GEMM-bound steps, jitgrad vs torch, at a given thread count and BLAS library.

    python benchmarks/blas.py [--threads 1 2 default] [--blas numpy mkl] [--repeats 15]

Each (threads, BLAS) configuration runs in a fresh child process, because thread pools
and the BLAS library are chosen at import: "default" leaves every thread variable unset,
so both libraries start at their own default (torch.get_num_threads(): physical cores;
jitgrad the same); a number N sets JITGRAD_NUM_THREADS=N and torch.set_num_threads(N).
JITGRAD_BLAS=mkl selects Intel's MKL for jitgrad (the `mkl` wheel; torch's CPU wheel
runs its own MKL either way). The workloads are side_by_side.py's: the MNIST MLP and
large MLP steps and one digits MLP epoch; the two libraries take turns, and each row is
the median of the repeats, each run after a pause that lets the other library's
threads stop spinning, and an untimed run. side_by_side.py runs the "default" child for its
default-thread rows.
"""
import argparse
import json
import os
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS",
               "JITGRAD_NUM_THREADS")
WORKLOADS = (("MNIST MLP", "step"), ("large MLP", "step"), ("digits MLP", "epoch"))


def child_env(threads, blas=None):
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS + ("JITGRAD_BLAS",)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p)
    if threads != "default":
        env["JITGRAD_NUM_THREADS"] = str(threads)
    if blas and blas != "numpy":
        env["JITGRAD_BLAS"] = blas
    return env


def run_child(threads, blas=None, repeats=15, workloads=WORKLOADS):
    """Rows {workload, phase, jitgrad_s, torch_s, threads: {lib: n}, blas} from a fresh process."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", str(threads), "--repeats", str(repeats),
           "--workloads", json.dumps(workloads)]
    proc = subprocess.run(cmd, env=child_env(threads, blas), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"blas child (threads {threads}, blas {blas}) failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _settled(setup, timed, pause=0.3):
    """setup, then a pause for the other library's workers to stop spinning (an OpenBLAS
    worker spins about 0.1 s after each call, an OpenMP one for a while too: on few cores
    one library's spinning pool slows the other's run severalfold, which no user's process,
    running one library, sees), then one untimed run, as the previous step of a training
    loop would have, so that the timed run finds its data in cache."""
    def run():
        state = setup()
        time.sleep(pause)
        timed(state)
        return state
    return run


def child(threads, repeats, workloads):
    sys.path.insert(0, REPO_ROOT)
    import torch

    import jitgrad
    from benchmarks import side_by_side as sbs
    if threads != "default":
        torch.set_num_threads(int(threads))
    libs = {"jitgrad": jitgrad, "torch": torch}
    phases = {name: {**sbs.make_mlp_phases(T), **sbs.training_phases(T)} for name, T in libs.items()}
    rows = []
    for key in map(tuple, workloads):
        sides = {name: (_settled(*phases[name][key][:2]), phases[name][key][1]) for name in libs}
        res = sbs.measure_phase(sides, warmup=2, repeats=repeats, min_time=0.5, max_wall=30.0)
        rows.append({"workload": key[0], "phase": key[1], "jitgrad_s": res["jitgrad"], "torch_s": res["torch"],
                     "threads": {"jitgrad": jitgrad.get_num_threads(), "torch": torch.get_num_threads()},
                     "blas": jitgrad.kernels.blas.BLAS_KEY})
    print(json.dumps(rows))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", nargs="+", default=["1", "2", "default"])
    p.add_argument("--blas", nargs="+", default=["numpy"], help="numpy (default), mkl, scipy")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--workloads", default=json.dumps(WORKLOADS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args.child, args.repeats, json.loads(args.workloads))
    print(f"{'workload':<12} {'phase':<6} {'threads':>8} {'blas':<24} {'jitgrad':>10} {'torch':>10} {'ratio':>7}")
    for blas in args.blas:
        for threads in args.threads:
            for r in run_child(threads, blas, args.repeats):
                print(f"{r['workload']:<12} {r['phase']:<6} {threads:>8} {r['blas']:<24} "
                      f"{r['jitgrad_s'] * 1e3:>8.3f}ms {r['torch_s'] * 1e3:>8.3f}ms "
                      f"{r['jitgrad_s'] / r['torch_s']:>7.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
