#!/usr/bin/env python3
"""Training throughput (tokens per second) of relgrad against a PyTorch implementation of the same
model on the same machine and threads: a pre-LayerNorm Transformer classifier with Shaw relative
attention, mean pooling, AdamW and gradient clipping, on batches of the same sizes and lengths.

    /usr/bin/python3 bench/training_throughput.py --relgrad build/relgrad [--precisions float32 bfloat16]

Two sizes: the quickstart model (configs/quickstart.json: 2 layers, D=64, H=4, batch 32, lengths
8-24) and a larger one (4 layers, D=256, H=8, feed-forward 1024, batch 32, lengths 64-128).
relgrad runs `relgrad train` (relative_order task) and its rate is taken from metrics.jsonl over
the training steps alone; PyTorch trains on random tokens and labels with lengths drawn from the
same range (the data does not change the work), in both of its formulations of relative
attention (gathering from Q E_K^T, and the [L, L, Dh] tables), after 3 warm-up steps.

Each precision runs relgrad with that `training.precision`, and PyTorch in its own form of it:
bfloat16 under `torch.autocast("cpu", torch.bfloat16)` (its bucketed form with the bucket sums
scattered in the weights' dtype: autocast leaves scatter_add's operands as they come); PyTorch
1.13 has no float16 autocast on the CPU, so a float16 row has no PyTorch peer. relgrad's rate
leaves out its first step, as PyTorch's leaves out its warm-up steps; the first step's time
beyond the steady rate (oneDNN's kernels made for the first shapes, memory first touched) is
reported apart, and so is the rate over the whole run.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

SIZES = {
    "quickstart": {"layers": 2, "dim": 64, "heads": 4, "ff_dim": 128, "dropout": 0.0, "k": 8, "batch": 32,
                   "lengths": [8, 24], "vocab": 16, "steps": 300},
    "larger": {"layers": 4, "dim": 256, "heads": 8, "ff_dim": 1024, "dropout": 0.1, "k": 8, "batch": 32,
               "lengths": [64, 128], "vocab": 16, "steps": 40},
}

TORCH_CHILD = r"""
import json, math, sys, time
import torch
import torch.nn as nn
size = json.loads(sys.argv[1]); form = sys.argv[2]; threads = int(sys.argv[3]); precision = sys.argv[4]
torch.set_num_threads(threads)
torch.manual_seed(1)
D, H, k, V = size["dim"], size["heads"], size["k"], size["vocab"]
Dh, K = D // H, 2 * k + 1

class RelativeAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.w_q, self.w_k, self.w_v, self.w_o = (nn.Linear(D, D) for _ in range(4))
        self.e_k = nn.Parameter(torch.randn(K, Dh) * 0.02)
        self.e_v = nn.Parameter(torch.randn(K, Dh) * 0.02)
    def forward(self, x, keep):                      # x [B, L, D], keep [B, L] bool
        B, L, _ = x.shape
        split = lambda t: t.reshape(B, L, H, Dh).transpose(1, 2)
        q, kk, v = split(self.w_q(x)), split(self.w_k(x)), split(self.w_v(x))
        r = torch.clamp(torch.arange(L)[None, :] - torch.arange(L)[:, None], -k, k) + k
        if form == "bucketed":
            index = r.expand(B, H, L, L)
            s = q @ kk.transpose(-1, -2) + torch.gather(q @ self.e_k.T, -1, index)
        else:
            s = q @ kk.transpose(-1, -2) + torch.einsum("bhid,ijd->bhij", q, self.e_k[r])
        s = (s / math.sqrt(Dh)).masked_fill(~keep[:, None, None, :], float("-inf"))
        a = torch.softmax(s, -1)
        if form == "bucketed":
            z = a @ v + torch.zeros(B, H, L, K, dtype=a.dtype).scatter_add(-1, index, a) @ self.e_v
        else:
            z = a @ v + torch.einsum("bhij,ijd->bhid", a, self.e_v[r])
        return self.w_o(z.transpose(1, 2).reshape(B, L, D))

class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attention = RelativeAttention()
        self.ff = nn.Sequential(nn.Linear(D, size["ff_dim"]), nn.GELU(), nn.Dropout(size["dropout"]),
                                nn.Linear(size["ff_dim"], D))
        self.drop = nn.Dropout(size["dropout"])
    def forward(self, x, keep):
        x = x + self.drop(self.attention(self.norm1(x), keep))
        return x + self.drop(self.ff(self.norm2(x)))

class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.layers = nn.ModuleList(Layer() for _ in range(size["layers"]))
        self.norm = nn.LayerNorm(D)
        self.out = nn.Linear(D, 2)
        self.drop = nn.Dropout(size["dropout"])
    def forward(self, ids, keep):
        x = self.drop(self.embed(ids) * math.sqrt(D))
        for layer in self.layers:
            x = layer(x, keep)
        x = self.norm(x)
        weights = keep[..., None].float()
        return self.out((x * weights).sum(1) / weights.sum(1))

model = Classifier()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), weight_decay=0.01)
low, high = size["lengths"]
def step():
    lengths = torch.randint(low, high + 1, (size["batch"],))
    L = int(lengths.max())
    ids = torch.randint(0, V, (size["batch"], L))
    keep = torch.arange(L)[None, :] < lengths[:, None]
    labels = torch.randint(0, 2, (size["batch"],))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bfloat16"):
        logits = model(ids, keep)
    loss = nn.functional.cross_entropy(logits.float(), labels)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return int(lengths.sum())
for _ in range(3):
    step()
tokens, start = 0, time.perf_counter()
for _ in range(size["steps"]):
    tokens += step()
elapsed = time.perf_counter() - start
print(json.dumps({"tokens_per_second": tokens / elapsed, "steps_per_second": size["steps"] / elapsed}))
"""


def relgrad_rate(relgrad, size, threads, attention, work, precision="float32"):
    config = {
        "model": {"layers": size["layers"], "dim": size["dim"], "heads": size["heads"], "ff_dim": size["ff_dim"],
                  "dropout": size["dropout"], "position": "relative", "k": size["k"], "attention": attention},
        "task": {"kind": "relative_order", "vocab": size["vocab"], "train_lengths": size["lengths"],
                 "test_lengths": size["lengths"], "train_examples": 4000, "test_examples": 64},
        "training": {"steps": size["steps"], "batch_size": size["batch"], "threads": threads, "log_every": 1,
                     "precision": precision},
        "evaluation": {"every": size["steps"]},
    }
    path = os.path.join(work, f"{attention}-{precision}.json")
    with open(path, "w") as f:
        json.dump(config, f)
    out = os.path.join(work, f"{attention}-{precision}")
    done = subprocess.run([relgrad, "train", path, "--out", out], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"relgrad train: {done.stderr.strip()}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        lines = [json.loads(line) for line in f if '"loss"' in line]
    # each line's tokens_per_second is the average over the steps so far: tokens so far = rate * seconds
    first, last = lines[0], lines[-1]
    tokens_first, tokens_all = first["tokens_per_second"] * first["seconds"], last["tokens_per_second"] * last["seconds"]
    steady = (tokens_all - tokens_first) / (last["seconds"] - first["seconds"])
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    return {"tokens_per_second": steady, "steps_per_second": (last["step"] - 1) / (last["seconds"] - first["seconds"]),
            "whole_run_tokens_per_second": last["tokens_per_second"],
            "first_step_extra_seconds": first["seconds"] - tokens_first / steady,
            "peak_live_mib": summary["peak_live_mib"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--relgrad", required=True, help="path to the relgrad program")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--precisions", nargs="+", default=["float32"], choices=["float32", "bfloat16", "float16"],
                        help="each run in turn: relgrad's training.precision, and PyTorch's autocast for bfloat16")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    rows = []
    print(f"{args.threads} threads; tokens = real (unpadded) tokens of the batches; relgrad's rate without its "
          "first step, whose time beyond that rate is the first-step column\n")
    print("| model | implementation | tokens/s | steps/s | tokens/s / best PyTorch of the precision | "
          "tokens/s / relgrad fused float32 | whole run tokens/s | first step s | peak live MiB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.sizes:
        size = SIZES[name]
        results, best_torch = {}, {}
        with tempfile.TemporaryDirectory() as work:
            for precision in args.precisions:
                label = "" if precision == "float32" else f" {precision}"
                for attention in ["bucketed", "fused"]:
                    results[f"relgrad {attention}{label}"] = (precision, relgrad_rate(
                        args.relgrad, size, args.threads, attention, work, precision))
                if precision == "float16":
                    continue  # no float16 autocast on the CPU in PyTorch 1.13
                for form in ["bucketed", "reference"]:
                    done = subprocess.run(["/usr/bin/python3", "-c", TORCH_CHILD, json.dumps(size), form,
                                           str(args.threads), precision], capture_output=True, text=True)
                    if done.returncode != 0:
                        sys.exit(f"torch {form} {precision}: {done.stderr.strip()}")
                    result = json.loads(done.stdout.strip().splitlines()[-1])
                    results[f"torch {form}{label}"] = (precision, result)
                    best_torch[precision] = max(best_torch.get(precision, 0), result["tokens_per_second"])
        fused32 = results.get("relgrad fused", (None, None))[1]
        for impl, (precision, result) in results.items():
            torch_ratio = (f"{result['tokens_per_second'] / best_torch[precision]:.2f}"
                           if precision in best_torch else "")
            fused_ratio = f"{result['tokens_per_second'] / fused32['tokens_per_second']:.2f}" if fused32 else ""
            whole = f"{result['whole_run_tokens_per_second']:.0f}" if "whole_run_tokens_per_second" in result else ""
            first = f"{result['first_step_extra_seconds']:.2f}" if "first_step_extra_seconds" in result else ""
            live = f"{result['peak_live_mib']:.1f}" if "peak_live_mib" in result else ""
            print(f"| {name} | {impl} | {result['tokens_per_second']:.0f} | {result['steps_per_second']:.2f} | "
                  f"{torch_ratio} | {fused_ratio} | {whole} | {first} | {live} |", flush=True)
            rows.append({"model": name, "implementation": impl, "precision": precision, **result})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
