"""python -m jitgrad.examples.digits: train an MLP and a CNN on scikit-learn's 8x8 digits.

The 1,797 images ship inside scikit-learn, so nothing is downloaded. The script trains
with jitgrad (and, when PyTorch is installed, trains the same model from the same
initial weights with PyTorch, so the epoch times can be compared side by side), prints
the test accuracy, and writes a loss-curve plot and the model's backward graph.

    pip install -e ".[examples]" && python -m jitgrad.examples.digits

With --compile, the same model is trained once more from the same weights with the
training step under jitgrad.compile (recorded at its first call, replayed after), and the
compiled epoch time is printed beside the eager one and PyTorch's.

With --device cuda, the model, the data and the training run on the GPU (jitgrad's
numba.cuda target, and PyTorch CUDA beside it when it has a GPU): the data set moves to
the device once and each batch is gathered there. --subset N trains and tests on the
first N images of each split (a smoke run: the tests run it on numba's CUDA simulator).

With --distributed, run under MPI, the training is data-parallel:

    pip install -e ".[distributed]" && mpiexec -n 2 python -m jitgrad.examples.digits --distributed

Each rank trains on its DistributedSampler share of the training set with the model in
DistributedDataParallel (gradients averaged over the ranks during backward), at
--batch-size // world_size images a step, so the global batch is --batch-size. Rank 0
prints and writes the plots; the other ranks are silent unless they fail.
"""
import argparse
import contextlib
import os
import time

import numpy as np


def load_split(seed=0, test_fraction=0.2):
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise SystemExit('scikit-learn is needed for the digits data: pip install -e ".[examples]"') from None
    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)      # pixel values are 0..16
    y = data.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def initial_weights(sizes, seed=0):
    """torch.nn.Linear's default init, drawn once in numpy so both libraries start equal."""
    rng = np.random.default_rng(seed)
    out = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        bound = 1.0 / np.sqrt(fan_in)
        out.append((rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32),
                    rng.uniform(-bound, bound, fan_out).astype(np.float32)))
    return out


def build_mlp(T, weights):
    layers = []
    for i, (w, b) in enumerate(weights):
        lin = T.nn.Linear(w.shape[1], w.shape[0])
        with T.no_grad():
            lin.weight.copy_(T.tensor(w))
            lin.bias.copy_(T.tensor(b))
        layers.append(lin)
        if i < len(weights) - 1:
            layers.append(T.nn.ReLU())
    return T.nn.Sequential(*layers)


def build_cnn(T, weights=None):
    """conv(1->8) relu pool conv(8->16) relu pool linear: 8x8 -> 4x4 -> 2x2 maps."""
    model = T.nn.Sequential(
        T.nn.Conv2d(1, 8, 3, padding=1), T.nn.ReLU(), T.nn.MaxPool2d(2),
        T.nn.Conv2d(8, 16, 3, padding=1), T.nn.ReLU(), T.nn.MaxPool2d(2),
        T.nn.Flatten(), T.nn.Linear(16 * 2 * 2, 10))
    if weights is not None:
        with T.no_grad():
            for p, w in zip(model.parameters(), weights):
                p.copy_(T.tensor(w))
    return model


def cnn_weights(seed=0):
    """PyTorch's default Conv2d/Linear init (bound 1/sqrt(fan_in)), drawn in numpy."""
    rng = np.random.default_rng(seed)
    out = []
    for shape in [(8, 1, 3, 3), (16, 8, 3, 3), (10, 16 * 2 * 2)]:
        bound = 1.0 / np.sqrt(np.prod(shape[1:]))
        out += [rng.uniform(-bound, bound, shape).astype(np.float32),
                rng.uniform(-bound, bound, shape[0]).astype(np.float32)]
    return out


def first_step(T, weights, data, batch_size, lr, kind, device="cpu"):
    """One training step of a throwaway copy of the model: jitgrad compiles (first run) or
    loads (later runs) the kernels training will use, and says so on stderr, before any
    progress bar starts. Returns its seconds."""
    t0 = time.perf_counter()
    _, step, (xtr, ytr, _, _) = setup(T, weights, data, lr, kind, device)
    if device == "cpu":
        step(T.tensor(xtr[:batch_size]), T.tensor(ytr[:batch_size]))
    else:
        step(xtr[:batch_size], ytr[:batch_size])
    synchronize(T, device)
    return time.perf_counter() - t0


def train(T, weights, data, epochs, batch_size, lr, progress=True, label="", kind="mlp", compiled=False,
          device="cpu", distributed=False):
    """One training run; returns (model, per-step losses, seconds per epoch, test accuracy).
    compiled=True runs the training step under T.compile; device="cuda" trains on the GPU.
    distributed=True (in an initialized process group): this rank's share of a data-parallel
    run, batch_size images a step on each rank; the losses are the global batches' (the
    mean over the ranks)."""
    model, step, (xtr, ytr, xte, yte) = setup(T, weights, data, lr, kind, device, distributed)
    if compiled:
        step = T.compile(step)
    orders = _distributed_orders(T, len(xtr)) if distributed else _orders(len(xtr))
    losses, epoch_times = [], []
    bar = _progress(epochs, progress, label)
    for epoch in range(epochs):
        order = orders(epoch)
        t0 = time.perf_counter()
        epoch_losses = run_epoch(T, step, xtr, ytr, order, batch_size)
        synchronize(T, device)                         # a GPU epoch ends when its kernels have run
        epoch_times.append(time.perf_counter() - t0)
        losses += _mean_over_ranks(T, epoch_losses) if distributed else epoch_losses
        bar.set_postfix(loss=f"{losses[-1]:.4f}")
        bar.update(1)
    bar.close()
    model.eval()
    with T.no_grad():
        pred = model(to_device(T, xte, device)).argmax(1).cpu().numpy()
    return model, losses, epoch_times, float((pred == yte).mean())


def _orders(n):
    """epoch -> the order of the training set: the same batches for both libraries."""
    order_rng = np.random.default_rng(1)
    return lambda epoch: order_rng.permutation(n)


def _distributed_orders(T, n):
    """epoch -> this rank's share of the training set, shuffled per epoch (the same
    permutation on every rank, split between them)."""
    sampler = T.utils.data.DistributedSampler(range(n), seed=1)

    def order(epoch):
        sampler.set_epoch(epoch)
        return np.fromiter(sampler, np.int64, len(sampler))
    return order


def _mean_over_ranks(T, losses):
    """Each step's loss averaged over the ranks (one all-reduce an epoch): the loss of the
    global batch, as a single process would have printed it (each rank's batch is as big)."""
    t = T.tensor(losses, dtype=T.float64)
    T.distributed.all_reduce(t)
    return (t / T.distributed.get_world_size()).tolist()


def setup(T, weights, data, lr, kind, device="cpu", distributed=False):
    """(model, its training step with Adam and cross-entropy, the data shaped for it). On
    the CPU the data stays numpy (each batch becomes a tensor); on a GPU the whole split
    is moved there once, as tensors. distributed=True: the step runs the model in
    DistributedDataParallel (which makes every rank start from rank 0's weights)."""
    xtr, ytr, xte, yte = data
    if kind == "cnn":                                   # images as (N, 1, 8, 8)
        xtr, xte = xtr.reshape(-1, 1, 8, 8), xte.reshape(-1, 1, 8, 8)
        model = build_cnn(T, weights)
    else:
        model = build_mlp(T, weights)
    if device != "cpu":
        model.to(device)
        xtr, ytr = to_device(T, xtr, device), to_device(T, ytr, device)
    net = T.nn.parallel.DistributedDataParallel(model) if distributed else model
    step = train_step(net, T.optim.Adam(model.parameters(), lr=lr), T.nn.CrossEntropyLoss())
    return model, step, (xtr, ytr, xte, yte)


def to_device(T, a, device):
    """A numpy array as a tensor on the device (one copy)."""
    return T.tensor(a, device=device)


def synchronize(T, device):
    if device != "cpu":
        T.cuda.synchronize()


def train_step(model, opt, loss_fn):
    """The step a batch takes, as a function of the batch alone (what jitgrad.compile records)."""
    def step(xb, yb):
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
        return loss
    return step


def run_epoch(T, step, xtr, ytr, order, batch_size):
    """One pass over the training set in the given order with step(xb, yb) (a train_step,
    compiled or not); returns the step losses. (benchmarks/side_by_side.py times exactly this.)
    xtr, ytr: numpy arrays (each batch becomes a tensor) or tensors already on a device
    (each batch is gathered there, with the order moved over once)."""
    on_device = not isinstance(xtr, np.ndarray)
    if on_device:
        order = T.tensor(order, device=xtr.device)
    losses = []
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        if on_device:
            loss = step(xtr[idx], ytr[idx])
        else:
            loss = step(T.tensor(xtr[idx]), T.tensor(ytr[idx]))
        losses.append(loss.item())
    return losses


def compile_status(T, weights, data, batch_size, lr, kind, device="cpu"):
    """One line: does the step replay from a plan, or what breaks it (T.compiler.explain on
    a fresh copy of the model, so the trained one is left as it is)."""
    _, step, (xtr, ytr, _, _) = setup(T, weights, data, lr, kind, device)
    xb, yb = xtr[:batch_size], ytr[:batch_size]
    if device == "cpu":
        xb, yb = T.tensor(xb), T.tensor(yb)
    out = T.compiler.explain(step, xb, yb)
    if not out.graph_break_count:
        return f"jitgrad.compile: the step replays from a plan ({out.op_count} ops)"
    return (f"jitgrad.compile: {out.graph_break_count} graph break(s), the first: {out.break_reasons[0]} "
            "(see jitgrad.compiler.explain)")


def _progress(total, enabled, label):
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if tqdm is None or not enabled:
        return _NoBar()
    return tqdm(total=total, desc=f"{label} epochs", unit="epoch")


class _NoBar:
    def set_postfix(self, **kw):
        pass

    def update(self, n):
        pass

    def close(self):
        pass


def save_plot(losses, path, torch_losses=None):
    try:
        import matplotlib
        matplotlib.use("Agg")              # no display on a server
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(losses, label="jitgrad", lw=1)
    if torch_losses is not None:
        ax.plot(torch_losses, label="PyTorch", lw=1, ls="--")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def save_graph(T, model, path_stem, input_shape, device="cpu"):
    """The backward graph of one batch's loss: an SVG where Graphviz's `dot` is
    installed, the DOT text otherwise."""
    viz = getattr(T, "viz", None)
    if viz is None:
        return None
    x = to_device(T, np.zeros((2,) + input_shape, dtype=np.float32), device)
    loss = T.nn.CrossEntropyLoss()(model(x), to_device(T, np.zeros(2, dtype=np.int64), device))
    try:
        dot = viz.make_dot(loss, params=dict(model.named_parameters()))
    except ImportError:
        return None
    try:
        return dot.render(path_stem, format="svg", cleanup=True)
    except Exception:                      # graphviz's `dot` binary missing: keep the DOT text
        with open(path_stem + ".dot", "w") as f:
            f.write(dot.source)
        return path_stem + ".dot"


def _torch_beside(jitgrad, device, skip):
    """PyTorch for the side-by-side run on the same device, or None (and why not, printed)."""
    if skip:
        return None
    try:
        import torch
    except ImportError:
        print("PyTorch not installed: no side-by-side timing")
        return None
    if device == "cuda" and not torch.cuda.is_available():
        print("PyTorch has no CUDA device here: no side-by-side timing")
        return None
    torch.set_num_threads(jitgrad.get_num_threads())   # same thread count on both sides
    return torch


def _first_steps_in_turn(T, distributed, *args):
    """first_step (see there); under --distributed rank 0 goes first and the other ranks
    after it, so that one process compiles and writes the kernel cache and the others load
    from it (rather than all compiling the same kernels side by side on shared cores)."""
    if not distributed:
        return first_step(T, *args)
    rank = T.distributed.get_rank()
    if rank != 0:
        T.distributed.barrier()
    seconds = first_step(T, *args)
    if rank == 0:
        T.distributed.barrier()
    return seconds


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32,
                   help="images a step (with --distributed: the global batch, batch-size // world_size on each rank)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--model", choices=["mlp", "cnn", "both"], default="both")
    p.add_argument("--out", default="digits_out", help="folder for the plots and graphs")
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch side-by-side run")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--compile", action="store_true",
                   help="also train with the step under jitgrad.compile and print its epoch time")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where the model, the data and the training live (cuda: numba.cuda, beside PyTorch CUDA)")
    p.add_argument("--subset", type=int, default=None, metavar="N",
                   help="train and test on the first N images of each split (a quick smoke run)")
    p.add_argument("--distributed", action="store_true",
                   help="data-parallel over MPI ranks: mpiexec -n 2 python -m jitgrad.examples.digits --distributed "
                        "(DistributedDataParallel on the CPU, each rank on its DistributedSampler share; no PyTorch "
                        "side-by-side run)")
    args = p.parse_args(argv)
    if args.distributed:
        if args.compile:
            p.error("--compile and --distributed: a compiled step replays its recording, which does not "
                    "include DistributedDataParallel's gradient all-reduces")
        if args.device != "cpu":
            p.error("--distributed trains on the CPU (MPI reduces the gradients' numpy buffers)")

    import jitgrad
    if not args.distributed:
        return run(jitgrad, args)
    # (an error on one rank, unhandled, aborts the whole MPI job: init_process_group's hook)
    jitgrad.distributed.init_process_group("mpi")
    if jitgrad.distributed.get_rank() == 0:
        accs = run(jitgrad, args)
    else:                                  # silent: rank 0 speaks for the job; errors still reach stderr
        jitgrad.set_verbosity(0)
        with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
            accs = run(jitgrad, args)
    jitgrad.distributed.destroy_process_group()
    return accs


def run(jitgrad, args):
    """The job main() parsed: on one process, or (args.distributed) on this rank of an
    initialized process group; returns the test accuracy of each model trained."""
    device, distributed = args.device, args.distributed
    if device == "cuda":
        if not jitgrad.cuda.is_available():
            raise SystemExit("--device cuda: no CUDA device (jitgrad needs an NVIDIA GPU with its driver, and "
                             "numba-cuda: pip install -e '.[cuda]')")
        print(f"device: cuda:0, {jitgrad.cuda.get_device_name()}")
    data = load_split()
    if args.subset is not None:
        data = tuple(a[:args.subset] for a in data)
    batch_size, rank, world = args.batch_size, 0, 1
    if distributed:
        rank, world = jitgrad.distributed.get_rank(), jitgrad.distributed.get_world_size()
        batch_size = args.batch_size // world
        if batch_size < 1:
            raise SystemExit(f"--batch-size {args.batch_size} is smaller than the {world} ranks")
        # (init_process_group gave each rank its share of the machine's cores)
        print(f"distributed: {world} ranks (MPI), {jitgrad.get_num_threads()} thread(s) each, "
              f"{batch_size} images a step on each rank")
    print(f"digits: {len(data[0])} train / {len(data[2])} test images, Adam lr={args.lr}, "
          f"batch {batch_size * world}")
    # PyTorch beside a distributed run would be a single process timed while the other ranks
    # wait, and MPI's waits spin on a core: its times would compare with nothing
    torch = _torch_beside(jitgrad, device, args.no_torch or distributed)
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
    progress = not args.no_progress and rank == 0
    accs = {}
    for kind in (["mlp", "cnn"] if args.model == "both" else [args.model]):
        if kind == "mlp":
            weights, shape = initial_weights([64, args.hidden, args.hidden, 10]), (64,)
            title = f"MLP 64-{args.hidden}-{args.hidden}-10"
        else:
            weights, shape = cnn_weights(), (1, 8, 8)
            title = "CNN conv8-pool-conv16-pool-linear"
        print(f"\n{title}")
        first = _first_steps_in_turn(jitgrad, distributed, weights, data, batch_size, args.lr, kind, device)
        print(f"jitgrad  first step {first:.2f} s (compiles kernels on a first run, loads them from the cache "
              "afterwards)")
        model, losses, times, acc = train(jitgrad, weights, data, args.epochs, batch_size, args.lr,
                                          progress, "jitgrad", kind, device=device, distributed=distributed)
        steady = times[1:] or times  # (the first epoch warms caches and allocators)
        print(f"jitgrad  test accuracy {acc:.2%}   epoch {np.median(steady) * 1e3:.1f} ms (median)"
              f"   first epoch {times[0]:.2f} s")
        if args.compile:
            _, closses, ctimes, cacc = train(jitgrad, weights, data, args.epochs, batch_size, args.lr,
                                             progress, "jitgrad.compile", kind, compiled=True, device=device)
            csteady = ctimes[1:] or ctimes
            print(f"compiled test accuracy {cacc:.2%}   epoch {np.median(csteady) * 1e3:.1f} ms (median)"
                  f"   first epoch {ctimes[0]:.2f} s (records the step)"
                  f"   epoch time compiled/eager: {np.median(csteady) / np.median(steady):.2f}x")
            print("         " + compile_status(jitgrad, weights, data, batch_size, args.lr, kind, device))
            diff = np.max(np.abs(np.subtract(closses, losses)) / np.abs(losses))
            print(f"         losses compiled vs eager: max relative difference {diff:.1e}")
        torch_losses = None
        if torch is not None:
            _, torch_losses, ttimes, tacc = train(torch, weights, data, args.epochs, batch_size, args.lr,
                                                  progress, "PyTorch", kind, device=device)
            tsteady = ttimes[1:] or ttimes
            vs_compiled = (f"   compiled/PyTorch: {np.median(csteady) / np.median(tsteady):.2f}x"
                           if args.compile else "")
            print(f"PyTorch  test accuracy {tacc:.2%}   epoch {np.median(tsteady) * 1e3:.1f} ms (median)   "
                  f"epoch time jitgrad/PyTorch: {np.median(steady) / np.median(tsteady):.2f}x{vs_compiled}")
        if rank == 0:
            plot = save_plot(losses, os.path.join(args.out, f"{kind}_loss_curve.png"), torch_losses)
            print(f"loss curve: {plot}" if plot else "loss curve: skipped (matplotlib not installed)")
            graph = save_graph(jitgrad, model, os.path.join(args.out, f"{kind}_graph"), shape, device)
            print(f"model graph: {graph}" if graph else "model graph: skipped (graphviz Python package not installed)")
        accs[kind] = acc
    return accs


if __name__ == "__main__":
    main()
