#!/usr/bin/env python3
"""relgrad against an independent PyTorch implementation.

Relative multi-head attention (Shaw et al. 2018), plain multi-head attention, the sinusoidal
encoding and the relative family beside Shaw (RoPE, Su et al. 2021; ALiBi, Press et al. 2022; T5's
bucketed bias, Raffel et al. 2020) are written here from their formulas, with PyTorch's autograd.
Each random configuration (and each fixed case of the family, in the fused form and one other) is
run through `relgrad layer` on the same .npy files; outputs and all gradients (float64) must agree to
1e-9. The input files are written in the layouts NumPy can write (C or Fortran order,
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


def rope(t, base):
    """RoPE on [..., L, Dh]: the pair (t_2s, t_2s+1) at position p turns by p * base^(-2s/Dh)
    (interleaved pairs, as in the paper)"""
    length, head_dim = t.shape[-2], t.shape[-1]
    theta = torch.tensor([base ** (-2.0 * s / head_dim) for s in range(head_dim // 2)], dtype=torch.float64)
    angle = torch.arange(length, dtype=torch.float64)[:, None] * theta  # [L, Dh/2]
    cos, sin = torch.cos(angle), torch.sin(angle)
    even, odd = t[..., 0::2], t[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


def alibi_slopes(heads):
    """the paper's code: 2^(-8h/H) for H a power of two, else the n = 2^floor(log2 H) slopes of n
    heads and then every other slope of 2n heads, the first H - n of them"""
    def power_of_two(n):
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]
    if math.log2(heads).is_integer():
        return power_of_two(heads)
    n = 2 ** math.floor(math.log2(heads))
    return power_of_two(n) + alibi_slopes(2 * n)[0::2][:heads - n]


def alibi_bias(heads, length):
    """b[h, i, j] = -m_h |j - i|"""
    distance = (torch.arange(length)[None, :] - torch.arange(length)[:, None]).abs().to(torch.float64)
    return -torch.tensor(alibi_slopes(heads), dtype=torch.float64)[:, None, None] * distance


def t5_bucket(r, bidirectional, num_buckets, max_distance):
    """HF transformers' T5Attention._relative_position_bucket of r = j - i, the log in float64"""
    ret, nb = 0, num_buckets
    if bidirectional:
        nb //= 2
        ret += nb if r > 0 else 0
        n = abs(r)
    else:
        n = max(-r, 0)
    max_exact = nb // 2
    if n < max_exact:
        return ret + n
    return ret + min(nb - 1, max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact)
                                              * (nb - max_exact)))


def t5_bias(table, length, bidirectional, num_buckets, max_distance):
    """b[h, i, j] = W[bucket(j - i), h], W = relative_attention_bias.weight [num_buckets, H]"""
    buckets = torch.tensor([[t5_bucket(j - i, bidirectional, num_buckets, max_distance) for j in range(length)]
                            for i in range(length)])
    return table[buckets].permute(2, 0, 1)


def attention(x, p, heads, mask, relative=None, rope_base=None, bias=None):
    """relative: None, or (k_left, k_right, shared); rope_base: rotate q and k (RoPE);
    bias: None or [H, L, L], added to the scores after the 1/sqrt(Dh) scale (ALiBi, T5)"""
    batch, length, dim = x.shape
    head_dim = dim // heads

    def linear(name, t):
        return t @ p[name + ".weight"].T + p[name + ".bias"]

    def split(t):
        return t.reshape(batch, length, heads, head_dim).transpose(1, 2)

    q, k, v = split(linear("w_q", x)), split(linear("w_k", x)), split(linear("w_v", x))
    if rope_base is not None:
        q, k = rope(q, rope_base), rope(k, rope_base)
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
    scores = scores / math.sqrt(head_dim)
    if bias is not None:
        scores = scores + bias
    weights = masked_softmax(scores, mask)
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


def random_mask(rng, batch, length, kind=None, lengths=None):
    """(mask as relgrad reads it, the same as a [B, 1, L, L]-broadcastable torch bool, mask_type);
    kind None draws one; a key padding mask of the given lengths when lengths is given"""
    if lengths is not None:
        kind = "padding"
    kind = kind or rng.choice(["none", "padding", "square", "batched"])
    if kind == "none":
        return None, None, None
    if kind == "padding":  # lengths may be 0: a fully masked row
        lengths = np.array(lengths) if lengths is not None else rng.integers(0, length + 1, size=batch)
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


# The relative family beside Shaw: fixed cases (each relgrad run costs about half a second, mostly
# loading its libraries, so they are few). Each runs in the fused form and one other, so that every
# layer meets all three forms. "options" go into the spec as they are (absent keys test relgrad's
# defaults); "lengths" is a key padding mask (0: a sequence with every key masked, whose output is
# b_o), "mask" a mask kind that random_mask draws.
FAMILY_CASES = [
    # RoPE: a small base so that the angles turn within 10 positions (Dh = 4), and the default base
    # with Dh = 6
    {"type": "rope_attention", "batch": 3, "length": 10, "dim": 8, "heads": 2, "causal": False,
     "lengths": [10, 0, 6], "options": {"rope_base": 100.0}, "forms": ["fused", "reference"]},
    {"type": "rope_attention", "batch": 2, "length": 9, "dim": 12, "heads": 2, "causal": True,
     "mask": "batched", "options": {}, "forms": ["fused", "bucketed"]},
    # ALiBi: 6 heads, not a power of two (slopes 1/4 .. 1/256, then 1/2, 1/8), and 4 heads
    {"type": "alibi_attention", "batch": 3, "length": 10, "dim": 12, "heads": 6, "causal": False,
     "lengths": [10, 0, 4], "options": {}, "forms": ["fused", "reference"]},
    {"type": "alibi_attention", "batch": 2, "length": 9, "dim": 8, "heads": 4, "causal": True,
     "mask": "square", "options": {}, "forms": ["fused", "bucketed"]},
    # T5: 8 buckets and max_distance 6 reach the log buckets and the last one within 12 positions,
    # bidirectional (the default without causal) and causal (the default with it); the defaults
    # 32 / 128 with L > 16 (log buckets from distance 8 per side, from 16 with causal buckets), and
    # causal buckets chosen without the causal mask (keys after the query share bucket 0)
    {"type": "t5_attention", "batch": 3, "length": 12, "dim": 8, "heads": 2, "causal": False,
     "lengths": [12, 0, 7], "options": {"t5_buckets": 8, "t5_max_distance": 6}, "forms": ["fused", "reference"]},
    {"type": "t5_attention", "batch": 2, "length": 12, "dim": 6, "heads": 3, "causal": True,
     "lengths": [12, 5], "options": {"t5_buckets": 8, "t5_max_distance": 6}, "forms": ["fused", "bucketed"]},
    {"type": "t5_attention", "batch": 2, "length": 24, "dim": 8, "heads": 2, "causal": False,
     "lengths": [24, 0], "options": {}, "forms": ["fused", "reference"]},
    {"type": "t5_attention", "batch": 1, "length": 22, "dim": 4, "heads": 2, "causal": False,
     "mask": "none", "options": {"bidirectional": False}, "forms": ["fused", "bucketed"]},
]


def family_cases():
    for case in FAMILY_CASES:
        for form in case["forms"]:
            yield dict(case, options=dict(case["options"], attention=form))


def run_case(relgrad, rng, layouts, case):
    """case: "type", and for fixed cases the sizes and mask that are otherwise drawn from rng"""
    def pick(key, draw):
        return case[key] if key in case else draw()
    batch = pick("batch", lambda: int(rng.integers(1, 4)))
    length = pick("length", lambda: int(rng.choice([1, 2, 3, 5, 7, 9])))
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
            heads = pick("heads", lambda: int(rng.choice([1, 2, 3])))
            dim = pick("dim", lambda: heads * int(rng.choice([1, 2, 4])))
            causal = pick("causal", lambda: bool(rng.random() < 0.4))
            spec.update({"dim": dim, "heads": heads, "causal": causal})
            spec.update(case.get("options", {}))
            mask_np, mask_t, mask_type = random_mask(rng, batch, length, case.get("mask"), case.get("lengths"))
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
            if kind == "t5_attention":  # relgrad's default: 32 buckets
                params["relative_attention_bias.weight"] = rng.normal(size=(spec.get("t5_buckets", 32), heads))
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
        elif kind == "rope_attention":  # relgrad's default base: 10000
            y = attention(x_t, p_t, spec["heads"], mask_t, rope_base=spec.get("rope_base", 10000.0))
        elif kind == "alibi_attention":
            y = attention(x_t, p_t, spec["heads"], mask_t, bias=alibi_bias(spec["heads"], length))
        elif kind == "t5_attention":  # relgrad's defaults: 32 buckets, 128, bidirectional unless causal
            bias = t5_bias(p_t["relative_attention_bias.weight"], length,
                           spec.get("bidirectional", not spec["causal"]),
                           spec.get("t5_buckets", 32), spec.get("t5_max_distance", 128))
            y = attention(x_t, p_t, spec["heads"], mask_t, bias=bias)
        else:
            y = attention(x_t, p_t, spec["heads"], mask_t,
                          (spec["k_left"], spec["k_right"], spec["share_across_heads"]))
        y.backward(torch.tensor(dy))
        expected = {"y": y.detach().numpy(), "dx": x_t.grad.numpy()}
        for name, tensor in p_t.items():
            expected["grad." + name] = tensor.grad.numpy()
        written = sorted(name[:-4] for name in os.listdir(out_dir) if name.startswith("grad."))
        if written != sorted(name for name in expected if name.startswith("grad.")):
            return spec, float("inf"), f"gradients written: {written}, expected one per parameter file"
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

    def check(case):
        nonlocal passed, failed
        spec, error, where = run_case(args.relgrad, rng, layouts, case)
        ok = error <= TOLERANCE
        passed += ok
        failed += not ok
        if not ok:
            print(f"FAIL {json.dumps(spec)}: max abs error {error:.3e} in {where}")

    for kind in ["relative_attention", "attention", "sinusoidal"]:
        for _ in range(args.configs):
            check({"type": kind})
        print(f"{kind}: {args.configs} random configurations checked")
    forms = {}
    for case in family_cases():  # after the random ones, which stay those of rng
        check(case)
        forms.setdefault(case["type"], []).append(case["options"]["attention"])
    for kind, done in forms.items():
        print(f"{kind}: {len(done)} fixed cases checked (forms {', '.join(sorted(set(done)))})")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
