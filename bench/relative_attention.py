#!/usr/bin/env python3
"""Relative multi-head attention, forward + backward, float32: relgrad's three implementations
against PyTorch on the same CPU threads, each configuration in its own process so that its peak
RSS is its own.

    /usr/bin/python3 bench/relative_attention.py --relgrad build/bench/bench_relative_attention
        [--long [--plot DIR]] [--window] [--core] [--json FILE]

Default (B=8, D=256, H=8, k=8, L in 128 256 512):
  relgrad reference : builds the [L, L, Dh] tables E[r(i, j)] (layers/attention.cpp)
  relgrad bucketed  : the attention op, keeps the [B, H, L, L] weights (engine/ops/attention.cpp)
  relgrad fused     : the fused_attention op, tiled with an online softmax (docs/layers/fused_attention.md)
  torch reference   : the same [L, L, Dh] tables, contracted with einsum
  torch bucketed    : gather from Q E_K^T [B, H, L, K], scatter_add of the weights into K buckets
  torch plain       : torch.nn.MultiheadAttention, no position terms
  lower bound       : the layer's matmul FLOPs over the engine's measured sgemm rate
  fused floor       : the projections' FLOPs over that rate, plus the fused kernel's own products at
                      the rate of its tiles' shapes and its exponentials (bench_relative_attention floor)
--long: B=1, L from 512 to 32768, relgrad's three forms until one no longer fits (a child that
  runs out of its address-space cap, --memory-gib, is reported as not fitting; the bigger L are
  then skipped for it).
--window: B=1, L=16384: fused with a local window of w=256 against fused full attention.
--core: relgrad's three forms on the attention alone (q, k, v [B, H, L, Dh] to z), without the
  projections and head split and merge that they share.
Prints markdown tables; --json writes every row, --plot DIR draws the --long figures.
"""
import argparse
import json
import os
import resource
import subprocess
import sys

TORCH_CHILD = r"""
import json, math, resource, sys, time
import torch
form, L, B, D, H, k, repeats, threads = sys.argv[1], *map(int, sys.argv[2:])
torch.set_num_threads(threads)
torch.manual_seed(1)
Dh, K = D // H, 2 * k + 1
def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20
def param(*shape):
    return (torch.randn(*shape) * 0.05).requires_grad_()
w = {n: (param(D, D), param(D)) for n in ("q", "k", "v", "o")}
e_k, e_v = param(K, Dh), param(K, Dh)
x = torch.randn(B, L, D, requires_grad=True)
dy = torch.randn(B, L, D)
r = torch.clamp(torch.arange(L)[None, :] - torch.arange(L)[:, None], -k, k) + k
plain = torch.nn.MultiheadAttention(D, H, batch_first=True)
def attention(x):
    if form == "plain":
        return plain(x, x, x, need_weights=False)[0]
    def proj(n, t):
        return t @ w[n][0].T + w[n][1]
    def split(t):
        return t.reshape(B, L, H, Dh).transpose(1, 2)
    q, kk, v = split(proj("q", x)), split(proj("k", x)), split(proj("v", x))
    if form == "reference":
        a_k, a_v = e_k[r], e_v[r]                                   # [L, L, Dh]
        s = q @ kk.transpose(-1, -2) + torch.einsum("bhid,ijd->bhij", q, a_k)
        a = torch.softmax(s / math.sqrt(Dh), -1)
        z = a @ v + torch.einsum("bhij,ijd->bhid", a, a_v)
    else:
        index = r.expand(B, H, L, L)
        s = q @ kk.transpose(-1, -2) + torch.gather(q @ e_k.T, -1, index)   # Q E_K^T: [B, H, L, K]
        a = torch.softmax(s / math.sqrt(Dh), -1)
        buckets = torch.zeros(B, H, L, K).scatter_add(-1, index, a)
        z = a @ v + buckets @ e_v
    return proj("o", z.transpose(1, 2).reshape(B, L, D))
baseline = rss_mib()
times = []
for i in range(repeats + 1):
    for p in [x, e_k, e_v] + [t for pair in w.values() for t in pair] + list(plain.parameters()):
        p.grad = None
    start = time.perf_counter()
    attention(x).backward(dy)
    if i > 0:
        times.append(time.perf_counter() - start)
times.sort()
print(json.dumps({"seconds": times[len(times) // 2], "baseline_rss_mib": baseline,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run(command, memory_gib=None):
    def cap():
        if memory_gib:
            limit = int(memory_gib * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    done = subprocess.run(command, capture_output=True, text=True, preexec_fn=cap)
    lines = done.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if lines else {}
    if done.returncode == 3 or (done.returncode != 0 and "out of memory" in done.stderr + done.stdout):
        return None  # does not fit
    if done.returncode != 0:
        sys.exit(f"{' '.join(command[:4])}...: {done.stderr.strip()}")
    return result


def projection_flops(B, L, D):
    """Matmul FLOPs of the four projections of one attention layer, forward, dX and dW."""
    return 24 * B * L * D * D


def layer_flops(B, L, D, H, k):
    """Matmul FLOPs of one relative attention layer, forward + backward: the four projections,
    q k^T and a v (forward and two products each backward), and the small Q E_K^T and W E_V
    products."""
    K = 2 * k + 1
    return projection_flops(B, L, D) + 12 * B * L * L * D + 12 * B * L * K * D


def relgrad_command(args, impl, length, batch, repeats, window=-1, part="layer"):
    return ["env", f"OMP_NUM_THREADS={args.threads}", args.relgrad, impl, str(length), str(batch), str(args.dim),
            str(args.heads), str(args.k), str(repeats), str(window), part]


def print_row(cells):
    print("| " + " | ".join(cells) + " |")


def compare_with_torch(args, rows):
    rate = run(["env", f"OMP_NUM_THREADS={args.threads}", args.relgrad, "sgemm", "2048"])["gflop_per_second"]
    print(f"B={args.batch} D={args.dim} H={args.heads} k={args.k} float32, {args.threads} threads, median of "
          f"{args.repeats}; engine sgemm rate {rate:.0f} GFLOP/s (N = 2048)\n")
    print_row(["L", "implementation", "seconds", "peak RSS MiB", "RSS before MiB", "time / relgrad fused"])
    print_row(["---"] * 6)
    shape = [str(args.batch), str(args.dim), str(args.heads), str(args.k), str(args.repeats)]
    for length in args.lengths:
        results = {}
        for impl in ["reference", "bucketed", "fused"]:
            results["relgrad " + impl] = run(relgrad_command(args, impl, length, args.batch, args.repeats))
        for form in ["reference", "bucketed", "plain"]:
            results["torch " + form] = run(["/usr/bin/python3", "-c", TORCH_CHILD, form, str(length), *shape,
                                            str(args.threads)])
        flops = layer_flops(args.batch, length, args.dim, args.heads, args.k)
        results["lower bound"] = {"seconds": flops / (rate * 1e9), "peak_rss_mib": float("nan"),
                                  "baseline_rss_mib": float("nan")}
        # the projections at the same rate, plus the fused kernel's products at its tiles' shapes and
        # its exponentials
        floor = run(["env", f"OMP_NUM_THREADS={args.threads}", args.relgrad, "floor", str(length), str(args.batch),
                     str(args.dim), str(args.heads)])
        results["fused floor"] = {"seconds": projection_flops(args.batch, length, args.dim) / (rate * 1e9)
                                  + floor["floor_seconds"], "peak_rss_mib": float("nan"),
                                  "baseline_rss_mib": float("nan")}
        base = results["relgrad fused"]["seconds"]
        for name, result in results.items():
            print_row([str(length), name, f"{result['seconds']:.4f}", f"{result['peak_rss_mib']:.0f}",
                       f"{result['baseline_rss_mib']:.0f}", f"{result['seconds'] / base:.2f}"])
            rows.append({"mode": "torch", "L": length, "implementation": name, **result})


def long_sequences(args, rows):
    print(f"B=1 D={args.dim} H={args.heads} k={args.k} float32, {args.threads} threads, median of "
          f"{args.long_repeats}; address space capped at {args.memory_gib} GiB per run\n")
    print_row(["L", "implementation", "seconds", "peak RSS MiB", "peak live tensors MiB"])
    print_row(["---"] * 5)
    too_big = set()
    for length in args.long_lengths:
        for impl in ["reference", "bucketed", "fused"]:
            if impl in too_big:
                continue
            result = run(relgrad_command(args, impl, length, 1, args.long_repeats), args.memory_gib)
            if result is None:
                too_big.add(impl)
                print_row([str(length), impl, "does not fit", "", ""])
                rows.append({"mode": "long", "L": length, "implementation": impl, "fits": False})
                continue
            print_row([str(length), impl, f"{result['seconds']:.3f}", f"{result['peak_rss_mib']:.0f}",
                       f"{result['peak_live_mib']:.0f}"])
            rows.append({"mode": "long", "implementation": impl, "fits": True, **result})


def window(args, rows):
    length, w = args.window_length, args.window_size
    print(f"B=1 L={length} D={args.dim} H={args.heads} k={args.k} float32, {args.threads} threads, median of "
          f"{args.long_repeats}\n")
    print_row(["attention", "seconds", "peak RSS MiB", "time / windowed"])
    print_row(["---"] * 4)
    windowed = run(relgrad_command(args, "fused", length, 1, args.long_repeats, w))
    full = run(relgrad_command(args, "fused", length, 1, args.long_repeats))
    for name, result in [(f"fused, window w={w}", windowed), ("fused, full", full)]:
        print_row([name, f"{result['seconds']:.3f}", f"{result['peak_rss_mib']:.0f}",
                   f"{result['seconds'] / windowed['seconds']:.1f}"])
        rows.append({"mode": "window", "name": name, **result})


def attention_core(args, rows):
    print(f"attention alone: B={args.batch} D={args.dim} H={args.heads} k={args.k} float32, {args.threads} "
          f"threads, median of {args.repeats}\n")
    print_row(["L", "implementation", "seconds", "peak RSS MiB", "RSS before MiB", "time / reference"])
    print_row(["---"] * 6)
    for length in args.lengths:
        results = {impl: run(relgrad_command(args, impl, length, args.batch, args.repeats, part="core"))
                   for impl in ["reference", "bucketed", "fused"]}
        for impl, result in results.items():
            print_row([str(length), impl, f"{result['seconds']:.4f}", f"{result['peak_rss_mib']:.0f}",
                       f"{result['baseline_rss_mib']:.0f}", f"{result['seconds'] / results['reference']['seconds']:.3f}"])
            rows.append({"mode": "core", **result})


def plot(rows, directory):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (time_ax, memory_ax) = plt.subplots(1, 2, figsize=(10, 4))
    for impl in ["reference", "bucketed", "fused"]:
        points = [r for r in rows if r["mode"] == "long" and r["implementation"] == impl and r["fits"]]
        lengths = [r["L"] for r in points]
        time_ax.plot(lengths, [r["seconds"] for r in points], marker="o", label=impl)
        memory_ax.plot(lengths, [r["peak_rss_mib"] for r in points], marker="o", label=impl)
    for ax, label in [(time_ax, "seconds per forward + backward"), (memory_ax, "peak RSS (MiB)")]:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length L (B = 1)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle("Relative attention, forward + backward, float32, D = 256, H = 8, k = 8")
    fig.tight_layout()
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "long_sequences.png")
    fig.savefig(path, dpi=110)
    print(f"\nwritten: {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--relgrad", required=True, help="path to bench_relative_attention")
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--long", action="store_true", help="B=1, L from 512 up, until it no longer fits")
    parser.add_argument("--long-lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384, 32768])
    parser.add_argument("--long-repeats", type=int, default=1)
    parser.add_argument("--memory-gib", type=float, default=16, help="address-space cap of each --long run")
    parser.add_argument("--window", action="store_true", help="fused with a local window against full attention")
    parser.add_argument("--window-length", type=int, default=16384)
    parser.add_argument("--window-size", type=int, default=256)
    parser.add_argument("--core", action="store_true", help="the attention alone, relgrad's three forms")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--plot", help="directory for the --long figure")
    args = parser.parse_args()
    rows = []
    if args.long:
        long_sequences(args, rows)
    if args.window:
        window(args, rows)
    if args.core:
        attention_core(args, rows)
    if not args.long and not args.window and not args.core:
        compare_with_torch(args, rows)
    if args.plot and args.long:
        plot(rows, args.plot)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
