#!/usr/bin/env python3
"""Relative attention on one GPU, forward + backward, q, k, v [B, H, L, Dh] to z: relgrad's fused
CUDA kernels against PyTorch on the same GPU, each length in its own process.

    python3 bench/cuda_attention.py --relgrad build/bench/bench_cuda_attention [--dtype bfloat16]
                                    [--budget S] [--json FILE]

Defaults float32, B=8, D=512, H=8 (Dh = 64), k=16, L = 512 ... 65536:
  relgrad fused     : flash-style tiles, both of Shaw's terms (bench/bench_cuda_attention.cpp)
  torch bucketed    : gather from Q E_K^T [B, H, L, K], softmax, scatter_add of the weights into the
                      K buckets for the value term; keeps [B, H, L, L] tensors
  torch flex        : (float32) FlexAttention with the key-side term as a score_mod (q . E_K[r(i, j)]
                      read from Q E_K^T); FlexAttention cannot express the value-side term, so it
                      does less work than the other two
With --dtype bfloat16 or float16, in that dtype, and instead of flex two forms without relative
terms, where FlashAttention-2 is the reference:
  relgrad plain     : relgrad's fused kernels without relative terms (--plain)
  torch flash       : scaled_dot_product_attention restricted to its FlashAttention-2 backend
Time is the median of --repeats after a warm-up; TFLOP/s counts the seven L x L x Dh products of a
forward + backward (14 B H L^2 Dh) for all three; memory is the most the step allocated on the GPU
(torch.cuda.max_memory_allocated, relgrad's memory_stats). A length whose time, extrapolated as
L^2 from the one before, would pass --budget seconds is skipped, and one that runs out of memory
is reported as such. Prints a markdown table.
"""
import argparse
import json
import subprocess
import sys

TORCH_CHILD = r"""
import json, math, sys, time
import torch
form, dtype, (L, B, D, H, k, repeats) = sys.argv[1], getattr(torch, sys.argv[2]), map(int, sys.argv[3:])
Dh, K = D // H, 2 * k + 1
dev = "cuda"
torch.manual_seed(1)
q, kk, v = (torch.randn(B, H, L, Dh, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
e_k, e_v = (torch.randn(K, Dh, device=dev, dtype=dtype, requires_grad=True) for _ in range(2))
dz = torch.randn(B, H, L, Dh, device=dev, dtype=dtype)
scale = 1 / math.sqrt(Dh)
if form == "bucketed":
    r = torch.clamp(torch.arange(L, device=dev)[None, :] - torch.arange(L, device=dev)[:, None], -k, k) + k
    def attend():
        index = r.expand(B, H, L, L)
        s = q @ kk.transpose(-1, -2) + torch.gather(q @ e_k.T, -1, index)
        a = torch.softmax(s * scale, -1)
        buckets = torch.zeros(B, H, L, K, device=dev, dtype=dtype).scatter_add(-1, index, a)
        return a @ v + buckets @ e_v
elif form == "flash":
    import torch.nn.functional as F
    def only_flash():
        try:
            from torch.nn.attention import sdpa_kernel, SDPBackend
            return sdpa_kernel(SDPBackend.FLASH_ATTENTION)
        except ImportError:  # torch 2.0 to 2.2
            return torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False, enable_mem_efficient=False)
    def attend():
        with only_flash():
            return F.scaled_dot_product_attention(q, kk, v)  # scale 1 / sqrt(Dh), as the others
else:
    from torch.nn.attention.flex_attention import flex_attention
    flex = torch.compile(flex_attention)
    def attend():
        qe = q @ e_k.T  # [B, H, L, K]
        def key_term(score, b, h, i, j):
            return score + qe[b, h, i, torch.clamp(j - i, -k, k) + k] * scale
        return flex(q, kk, v, score_mod=key_term, scale=scale)
times = []
torch.cuda.reset_peak_memory_stats()
before = torch.cuda.memory_allocated()
for i in range(repeats + 1):
    for t in (q, kk, v, e_k, e_v):
        t.grad = None
    torch.cuda.synchronize()
    start = time.perf_counter()
    attend().backward(dz)
    torch.cuda.synchronize()
    if i > 0:
        times.append(time.perf_counter() - start)
times.sort()
print(json.dumps({"seconds": times[len(times) // 2],
                  "step_mib": (torch.cuda.max_memory_allocated() - before) / 2**20}))
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--relgrad", required=True, help="build/bench/bench_cuda_attention")
    parser.add_argument("--python", default=sys.executable, help="the Python with PyTorch and a GPU")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget", type=float, default=60, help="seconds one length may take, per form")
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384, 32768, 65536])
    parser.add_argument("--json", help="also write every row here")
    args = parser.parse_args()
    shape = [str(args.batch), str(args.dim), str(args.heads), str(args.k)]
    Dh = args.dim // args.heads

    rows = []
    sixteen_bit = args.dtype != "float32"
    for form, options in [("relgrad fused", []), ("relgrad plain", ["--plain"])][:2 if sixteen_bit else 1]:
        relgrad = subprocess.run([args.relgrad, "--dtype", args.dtype, *options, *shape, str(args.repeats),
                                  str(int(args.budget)), *map(str, args.lengths)], capture_output=True, text=True)
        if relgrad.returncode != 0:
            sys.exit(f"{args.relgrad}: {relgrad.stderr.strip()}")
        for line in relgrad.stdout.splitlines():
            result = json.loads(line)
            rows.append({"form": form, **result})

    for form in ["bucketed", "flash" if sixteen_bit else "flex"]:
        previous = None
        for length in args.lengths:
            row = {"form": "torch " + form, "L": length}
            if previous and previous[1] * (length / previous[0]) ** 2 * (args.repeats + 1) > args.budget:
                row["skipped"] = f"predicted {previous[1] * (length / previous[0]) ** 2:.1f} s per step"
                rows.append(row)
                continue
            done = subprocess.run([args.python, "-c", TORCH_CHILD, form, args.dtype, str(length), *shape,
                                   str(args.repeats)], capture_output=True, text=True)
            if done.returncode != 0:
                row["error"] = "out of memory" if "out of memory" in done.stderr else done.stderr.strip()[-300:]
            else:
                row.update(json.loads(done.stdout.strip().splitlines()[-1]))
                flops = 14.0 * args.batch * args.heads * length * length * Dh
                row["tflop_per_second"] = flops / row["seconds"] / 1e12
                previous = (length, row["seconds"])
            rows.append(row)

    print(f"B={args.batch} D={args.dim} H={args.heads} k={args.k} {args.dtype}, forward + backward, median of "
          f"{args.repeats}\n")
    print("| L | form | seconds | TFLOP/s | step memory MiB | note |")
    print("|---|---|---|---|---|---|")
    for row in sorted(rows, key=lambda r: (r["L"], r["form"])):
        if "seconds" in row:
            print(f"| {row['L']} | {row['form']} | {row['seconds']:.4f} | {row['tflop_per_second']:.1f} | "
                  f"{row['step_mib']:.0f} | |")
        else:
            print(f"| {row['L']} | {row['form']} | | | | {row.get('skipped') or row.get('error')} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
