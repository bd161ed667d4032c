#!/usr/bin/env python3
"""Relative multi-head attention, forward + backward, float32: relgrad's two implementations
against two PyTorch formulations of the same math, each configuration in its own process so that
its peak RSS is its own.

    python3 bench/relative_attention.py --relgrad build/bench/bench_relative_attention

relgrad reference: builds the [L, L, Dh] tables E[r(i, j)] (layers/attention.cpp)
relgrad bucketed : the attention op with the relative terms folded in (engine/ops/attention.cpp)
torch reference  : the same [L, L, Dh] tables, contracted with einsum
torch bucketed   : gather from Q E_K^T [B, H, L, K], scatter_add of the weights into K buckets
Prints a markdown table: median seconds per forward+backward, peak RSS, and the RSS before the
first forward (so peak - baseline is what the attention itself needed).
"""
import argparse
import json
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
def attention(x):
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
    for p in [x, e_k, e_v] + [t for pair in w.values() for t in pair]:
        p.grad = None
    start = time.perf_counter()
    attention(x).backward(dy)
    if i > 0:
        times.append(time.perf_counter() - start)
times.sort()
print(json.dumps({"seconds": times[len(times) // 2], "baseline_rss_mib": baseline,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run(command):
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command[:3])}...: {done.stderr.strip()}")
    return json.loads(done.stdout.strip().splitlines()[-1])


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
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    shape = [args.batch, args.dim, args.heads, args.k, args.repeats]
    rows = []
    print(f"B={args.batch} D={args.dim} H={args.heads} k={args.k} float32, {args.threads} threads, "
          f"median of {args.repeats}\n")
    print("| L | implementation | seconds | peak RSS MiB | RSS before MiB | time / relgrad bucketed |")
    print("| --- | --- | --- | --- | --- | --- |")
    for length in args.lengths:
        results = {}
        env_threads = [f"OMP_NUM_THREADS={args.threads}"]
        for impl in ["reference", "bucketed"]:
            results["relgrad " + impl] = run(["env", *env_threads, args.relgrad, impl, str(length), *map(str, shape)])
        for form in ["reference", "bucketed"]:
            results["torch " + form] = run(["/usr/bin/python3", "-c", TORCH_CHILD, form, str(length),
                                            *map(str, shape), str(args.threads)])
        base = results["relgrad bucketed"]["seconds"]
        for name, result in results.items():
            print(f"| {length} | {name} | {result['seconds']:.4f} | {result['peak_rss_mib']:.0f} | "
                  f"{result['baseline_rss_mib']:.0f} | {result['seconds'] / base:.2f} |")
            rows.append({"L": length, "implementation": name, **result})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
