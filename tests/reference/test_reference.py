#!/usr/bin/env python3
"""relgrad against an independent PyTorch implementation.

Relative multi-head attention (Shaw et al. 2018), plain multi-head attention and the sinusoidal
encoding are written here from their formulas, with PyTorch's autograd. Each random configuration
is run through `relgrad layer` on the same .npy files; outputs and all gradients (float64) must
agree to 1e-9. The input files are written in the layouts NumPy can write (C or Fortran order,
little- or big-endian; masks in any numeric dtype), which all hold the same values.

    python3 tests/reference/test_reference.py --relgrad build/relgrad [--configs 40] [--seed 1]
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

TOLERANCE = 1e-9


def relative_index(length, k_left, k_right):
    """r(i, j) = clip(j - i, -k_left, k_right) + k_left"""
    i = torch.arange(length)[:, None]
    j = torch.arange(length)[None, :]
    return torch.clamp(j - i, -k_left, k_right) + k_left


def masked_softmax(scores, mask):
    """softmax over the last dim; masked entries get 0, a fully masked row is all 0"""
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    row_max = scores.amax(-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max)).detach()
    weights = torch.exp(scores - row_max)
    total = weights.sum(-1, keepdim=True)
    return weights / torch.where(total > 0, total, torch.ones_like(total))


def attention(x, p, heads, mask, relative=None):
    """relative: None, or (k_left, k_right, shared)"""
    batch, length, dim = x.shape
    head_dim = dim // heads

    def linear(name, t):
        return t @ p[name + ".weight"].T + p[name + ".bias"]

    def split(t):
        return t.reshape(batch, length, heads, head_dim).transpose(1, 2)

    q, k, v = split(linear("w_q", x)), split(linear("w_k", x)), split(linear("w_v", x))
    scores = q @ k.transpose(-1, -2)
    if relative is not None:
        k_left, k_right, shared = relative
        r = relative_index(length, k_left, k_right)
        buckets = k_left + k_right + 1
        if shared:  # A[i, j] = E[r(i, j)], [L, L, Dh]
            a_k, a_v = p["rel_pos_emb_k.weight"][r], p["rel_pos_emb_v.weight"][r]
            scores = scores + torch.einsum("bhid,ijd->bhij", q, a_k)
        else:  # one table per head: [L, L, H, Dh]
            a_k = p["rel_pos_emb_k.weight"].reshape(buckets, heads, head_dim)[r]
            a_v = p["rel_pos_emb_v.weight"].reshape(buckets, heads, head_dim)[r]
            scores = scores + torch.einsum("bhid,ijhd->bhij", q, a_k)
    weights = masked_softmax(scores / math.sqrt(head_dim), mask)
    z = weights @ v
    if relative is not None:
        z = z + (torch.einsum("bhij,ijd->bhid", weights, a_v) if shared else torch.einsum("bhij,ijhd->bhid", weights, a_v))
    return linear("w_o", z.transpose(1, 2).reshape(batch, length, dim))


def sinusoidal(x):
    """x + PE, PE[p, 2i] = sin(p / 10000^(2i/D)), PE[p, 2i+1] = cos(p / 10000^(2i/D))"""
    length, dim = x.shape[1], x.shape[2]
    position = torch.arange(length, dtype=torch.float64)[:, None]
    column = torch.arange(dim)
    angle = position / torch.pow(10000.0, (2 * (column // 2)).to(torch.float64) / dim)
    pe = torch.where(column % 2 == 0, torch.sin(angle), torch.cos(angle))
    return x + pe


def random_mask(rng, batch, length):
    """(mask as relgrad reads it, the same as a [B, 1, L, L]-broadcastable torch bool, mask_type)"""
    kind = rng.choice(["none", "padding", "square", "batched"])
    if kind == "none":
        return None, None, None
    if kind == "padding":  # lengths may be 0: a fully masked row
        lengths = rng.integers(0, length + 1, size=batch)
        keep = np.arange(length)[None, :] < lengths[:, None]
        return keep, torch.from_numpy(keep)[:, None, None, :], "key_padding"
    if kind == "square":
        keep = rng.random((length, length)) < 0.7
        return keep, torch.from_numpy(keep), "attention"
    keep = rng.random((batch, length, length)) < 0.7
    return keep.astype(np.float32), torch.from_numpy(keep)[:, None], "attention"  # any dtype: non-zero = attend


def save(path, value, layouts):
    """np.save in a layout drawn from `layouts`: C or Fortran order, little- or big-endian"""
    if layouts.random() < 0.3:
        value = np.asfortranarray(value)
    if layouts.random() < 0.3:
        value = value.astype(value.dtype.newbyteorder(">"))
    np.save(path, value)


def combine(mask, causal, length):
    if not causal:
        return mask
    lower = torch.tril(torch.ones(length, length, dtype=torch.bool))
    return lower if mask is None else mask & lower


def run_case(relgrad, rng, layouts, case):
    batch = int(rng.integers(1, 4))
    length = int(rng.choice([1, 2, 3, 5, 7, 9]))
    kind = case["type"]
    with tempfile.TemporaryDirectory() as work:
        in_dir, out_dir = os.path.join(work, "in"), os.path.join(work, "out")
        os.makedirs(in_dir)
        spec = {"type": kind, "dtype": "float64"}
        params = {}
        mask_np = mask_t = None
        if kind == "sinusoidal":
            dim = int(rng.choice([1, 3, 4, 7, 10]))
            spec["dim"] = dim
        else:
            heads = int(rng.choice([1, 2, 3]))
            dim = heads * int(rng.choice([1, 2, 4]))
            causal = bool(rng.random() < 0.4)
            spec.update({"dim": dim, "heads": heads, "causal": causal})
            mask_np, mask_t, mask_type = random_mask(rng, batch, length)
            if mask_np is not None:
                mask_dtype = layouts.choice(["bool", "int8", "uint16", "int32", "uint64", "float16", "float64"])
                save(os.path.join(in_dir, "mask.npy"), mask_np.astype(mask_dtype), layouts)
                spec["mask_type"] = mask_type
            mask_t = combine(mask_t, causal, length)
            for name in ["w_q", "w_k", "w_v", "w_o"]:
                params[name + ".weight"] = rng.normal(size=(dim, dim)) / math.sqrt(dim)
                params[name + ".bias"] = rng.normal(size=dim) * 0.1
            if kind == "relative_attention":
                k_left, k_right = int(rng.integers(0, 10)), int(rng.integers(0, 10))
                shared = bool(rng.random() < 0.5)
                spec.update({"k_left": k_left, "k_right": k_right, "share_across_heads": shared,
                             "attention": str(rng.choice(["reference", "bucketed", "fused"]))})
                width = dim // heads if shared else dim
                for name in ["rel_pos_emb_k.weight", "rel_pos_emb_v.weight"]:
                    params[name] = rng.normal(size=(k_left + k_right + 1, width))
        x = rng.normal(size=(batch, length, dim))
        dy = rng.normal(size=(batch, length, dim))
        save(os.path.join(in_dir, "x.npy"), x, layouts)
        save(os.path.join(in_dir, "dy.npy"), dy, layouts)
        for name, value in params.items():
            save(os.path.join(in_dir, name + ".npy"), value, layouts)
        spec_path = os.path.join(work, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        done = subprocess.run([relgrad, "layer", "--spec", spec_path, "--in", in_dir, "--out", out_dir],
                              capture_output=True, text=True)
        if done.returncode != 0:
            return spec, float("inf"), "relgrad layer failed: " + done.stderr.strip()

        x_t = torch.tensor(x, requires_grad=True)
        p_t = {name: torch.tensor(value, requires_grad=True) for name, value in params.items()}
        if kind == "sinusoidal":
            y = sinusoidal(x_t)
        elif kind == "attention":
            y = attention(x_t, p_t, spec["heads"], mask_t)
        else:
            y = attention(x_t, p_t, spec["heads"], mask_t,
                          (spec["k_left"], spec["k_right"], spec["share_across_heads"]))
        y.backward(torch.tensor(dy))
        expected = {"y": y.detach().numpy(), "dx": x_t.grad.numpy()}
        for name, tensor in p_t.items():
            expected["grad." + name] = tensor.grad.numpy()
        worst, where = 0.0, ""
        for name, value in expected.items():
            got = np.load(os.path.join(out_dir, name + ".npy"))
            if got.shape != value.shape:
                return spec, float("inf"), f"{name}: shape {got.shape}, expected {value.shape}"
            error = float(np.max(np.abs(got - value))) if value.size else 0.0
            if error > worst:
                worst, where = error, name
        return spec, worst, where


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--relgrad", required=True, help="path to the relgrad program")
    parser.add_argument("--configs", type=int, default=40, help="random configurations per layer type")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    torch.set_default_dtype(torch.float64)
    rng = np.random.default_rng(args.seed)
    layouts = np.random.default_rng(args.seed + 1)  # its own stream: the configurations stay those of rng
    passed = failed = 0
    for kind in ["relative_attention", "attention", "sinusoidal"]:
        for _ in range(args.configs):
            spec, error, where = run_case(args.relgrad, rng, layouts, {"type": kind})
            ok = error <= TOLERANCE
            passed += ok
            failed += not ok
            if not ok:
                print(f"FAIL {json.dumps(spec)}: max abs error {error:.3e} in {where}")
        print(f"{kind}: {args.configs} random configurations checked")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
