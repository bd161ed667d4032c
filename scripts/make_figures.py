#!/usr/bin/python3
"""Draws the figures of docs/ from relgrad itself, as SVG files that are the same bytes on every run.
One file: every figure, one function each, sharing the drawing helpers and the byte-stable SVG writer.

    /usr/bin/python3 scripts/make_figures.py [--build build] [--out docs/figures]

Each figure is computed by the library's own ops and layers (the relgrad Python module of the
build, `--build`/python) and drawn with matplotlib. Where a picture shows a quantity the module
does not hand out (the fused kernel's running max and bucket sums, a bias inside a layer's
scores), the script computes it from what the module does give and then checks it against the
module's own output: the figure fails to build rather than drift from the code.

The files are deterministic: every random number comes from relgrad.randn (Philox, the same on
every machine), everything is computed in float64, and the SVG has no date, no creator line and
ids hashed from a fixed salt. tests/docs/test_figures.py regenerates them into a temporary folder
and compares them with docs/figures/ byte for byte.

The figures and the pages that show them:

    relative_index.svg     docs/layers/relative_position.md   r(i, j) and its clipping
    fused_tile_walk.svg    docs/layers/fused_attention.md     the tiles, the running max, the buckets N_i
    gate_mix.svg           docs/layers/gated.md               the weights at g_h near 0, 0.5 and near 1
    t5_buckets.svg         docs/layers/t5_bias.md             bucket(d) over the distance d
    rope_rotation.svg      docs/layers/rope.md                pairs turned by p theta_t; q'_i . k'_j by j - i
    alibi_biases.svg       docs/layers/alibi.md               -m_h |d| per head, read back from a layer
    autograd_graph.svg     docs/engine.md                     the graph of the worked example, its gradients
"""
import argparse
import io
import os
import re
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default=os.path.join(REPO, "build"),
                        help="the build folder whose python/ holds the relgrad module (default: build)")
    parser.add_argument("--out", default=os.path.join(REPO, "docs", "figures"),
                        help="where to write the SVG files (default: docs/figures)")
    return parser.parse_args()


def import_libraries(build):
    sys.path.insert(0, os.path.join(os.path.abspath(build), "python"))
    import matplotlib

    matplotlib.use("svg")
    matplotlib.rcParams.update({
        "svg.hashsalt": "relgrad-docs",  # ids from a fixed salt, not random ones
        "svg.fonttype": "none",          # text as <text>, not glyph outlines: small files
        "font.family": "DejaVu Sans",
        "font.size": 8,
        "axes.titlesize": 8,
        "axes.labelsize": 8,
        "xtick.labelsize": 7,
        "ytick.labelsize": 7,
        "legend.fontsize": 7,
        "axes.spines.top": False,
        "axes.spines.right": False,
    })
    import matplotlib.pyplot as plt
    import relgrad

    return relgrad, plt


def randn(relgrad, *shape, seed):
    """float64 standard normals from relgrad's own generator (Philox): the same on every machine"""
    return relgrad.randn(*shape, seed=seed, dtype="float64").numpy().copy()


def f64(relgrad, array):
    return relgrad.tensor(np.asarray(array, dtype=np.float64))


def draw_cells(plt, ax, colors, edgecolor="white", linewidth=0.5, hatch=None, size=(1, 1)):
    """Fills cell (i, j), the rectangle [j w, (j + 1) w] x [i h, (i + 1) h] with (w, h) = size, with
    colors[i][j] (a colour string, or None for no cell), one compound path per colour: a few path
    elements instead of one per cell, which keeps the SVG small."""
    from matplotlib.path import Path
    from matplotlib.patches import PathPatch

    groups = {}
    for i, row in enumerate(colors):
        for j, color in enumerate(row):
            if color is not None:
                groups.setdefault(color, []).append((i, j))
    for color in sorted(groups):
        vertices, codes = [], []
        w, h = size
        for i, j in groups[color]:
            vertices += [(j * w, i * h), ((j + 1) * w, i * h), ((j + 1) * w, (i + 1) * h), (j * w, (i + 1) * h),
                         (j * w, i * h)]
            codes += [Path.MOVETO, Path.LINETO, Path.LINETO, Path.LINETO, Path.CLOSEPOLY]
        ax.add_patch(PathPatch(Path(vertices, codes), facecolor=color, edgecolor=edgecolor, linewidth=linewidth,
                               hatch=hatch))


def draw_frames(ax, cells, color):
    """A frame inside each cell (i, j) of `cells`, all in one path"""
    from matplotlib.path import Path
    from matplotlib.patches import PathPatch

    vertices, codes = [], []
    for i, j in cells:
        vertices += [(j + 0.1, i + 0.1), (j + 0.9, i + 0.1), (j + 0.9, i + 0.9), (j + 0.1, i + 0.9), (0, 0)]
        codes += [Path.MOVETO, Path.LINETO, Path.LINETO, Path.LINETO, Path.CLOSEPOLY]
    ax.add_patch(PathPatch(Path(vertices, codes), fill=False, edgecolor=color, linewidth=1))


def colors_of(plt, matrix, cmap, vmin, vmax, levels):
    """matrix's values as colours of `cmap`, quantised to `levels` steps between vmin and vmax"""
    from matplotlib.colors import to_hex

    steps = np.clip(np.floor((np.asarray(matrix) - vmin) / (vmax - vmin) * levels), 0, levels - 1)
    palette = [to_hex(plt.get_cmap(cmap)((n + 0.5) / levels)) for n in range(levels)]
    return [[palette[int(n)] for n in row] for row in steps]


# ------------------------------------------------------------------- Shaw: r(i, j) with clipping


def relative_index(relgrad, plt):
    """r(i, j) = clip(j - i, -k_left, k_right) + k_left, as RelativePositionEmbedding.index gives it"""
    L = 8
    cases = [(2, 2), (1, 3)]  # (k_left, k_right)
    fig, axes = plt.subplots(1, 2, figsize=(6.0, 3.1))
    for ax, (k_left, k_right) in zip(axes, cases):
        r = relgrad.nn.RelativePositionEmbedding(1, k_left=k_left, k_right=k_right).index(L, L).numpy()
        K = k_left + k_right + 1
        distance = np.arange(L)[None, :] - np.arange(L)[:, None]  # j - i
        assert np.array_equal(r, np.clip(distance, -k_left, k_right) + k_left)
        draw_cells(plt, ax, colors_of(plt, r, "viridis", -0.5, K - 0.5, K))
        clipped = (distance < -k_left) | (distance > k_right)
        for i in range(L):
            for j in range(L):
                ax.text(j + 0.5, i + 0.55, str(r[i, j]), ha="center", va="center", fontsize=7,
                        color="black" if r[i, j] > (K - 1) * 0.6 else "white",
                        fontweight="bold" if clipped[i, j] else "normal")
        draw_frames(ax, zip(*np.nonzero(clipped)), "#ff7f0e")
        ax.set_xlim(0, L)
        ax.set_ylim(L, 0)
        ax.set_aspect("equal")
        ax.set_xticks(np.arange(L) + 0.5, [str(j) for j in range(L)])
        ax.set_yticks(np.arange(L) + 0.5, [str(i) for i in range(L)])
        ax.tick_params(length=0)
        ax.xaxis.set_label_position("top")
        ax.xaxis.tick_top()
        ax.spines[:].set_visible(False)
        ax.set_xlabel("key j")
        ax.set_ylabel("query i")
        title = f"k = {k_left}" if k_left == k_right else f"k_left = {k_left}, k_right = {k_right}"
        ax.set_title(f"{title}: K = {K} buckets", pad=24)
    fig.text(0.5, 0.03, "r(i, j) = clip(j - i, -k_left, k_right) + k_left.  Framed: a pair beyond the clip, "
             "which shares the end bucket.", ha="center", fontsize=7)
    fig.subplots_adjust(left=0.07, right=0.98, top=0.8, bottom=0.1, wspace=0.2)
    return fig


# ------------------------------------------------------------------- the fused kernel's tile walk


def kernel_tiles():
    """kQueryTile and kKeyTile as engine/backend/cpu/cpu_backend.hpp declares them"""
    with open(os.path.join(REPO, "engine", "backend", "cpu", "cpu_backend.hpp")) as header:
        text = header.read()
    sizes = {}
    for name in ("kQueryTile", "kKeyTile"):
        match = re.search(r"constexpr\s+int64_t\s+" + name + r"\s*=\s*(\d+)\s*;", text)
        if not match:
            raise SystemExit(f"make_figures: no 'constexpr int64_t {name} = ...;' in cpu_backend.hpp")
        sizes[name] = int(match.group(1))
    return sizes["kQueryTile"], sizes["kKeyTile"]


def fused_tile_walk(relgrad, plt):
    """The CPU kernel's forward for one causal (batch, head): which tiles it visits, and for one
    query row the running max m and the bucket sums N_i[r] after each key tile.

    The module does not expose the kernel's running state, so this function runs the recurrence of
    docs/layers/fused_attention.md on scores made with the module's ops (matmul, gather, the
    layer's index r(i, j)) and checks the result, (acc_i + N_i E_V) / l_i, against
    relgrad.fused_attention's own z_i."""
    query_tile, key_tile = kernel_tiles()
    L, Dh, k = 4 * key_tile, 8, 4
    K = 2 * k + 1
    row = L - 24  # the row followed: it sees the keys 0 .. row, in four key tiles
    c = 1 / np.sqrt(Dh)
    q = randn(relgrad, 1, 1, L, Dh, seed=11)
    keys = randn(relgrad, 1, 1, L, Dh, seed=12)
    # a slow drift along the keys, so that the running max moves from tile to tile
    keys += 0.0012 * np.arange(L)[None, None, :, None] * q[:, :, row:row + 1, :]
    v = randn(relgrad, 1, 1, L, Dh, seed=13)
    table_k = randn(relgrad, 1, K, Dh, seed=14)
    table_v = randn(relgrad, 1, K, Dh, seed=15)

    # the scores of the row, with the module's ops: s_ij = c (q_i . k_j + QE[i, r(i, j)])
    r = relgrad.nn.RelativePositionEmbedding(Dh, k=k).index(L, L)
    qk = relgrad.matmul(f64(relgrad, q[0, 0]), f64(relgrad, keys[0, 0]).T).numpy()
    qe = relgrad.matmul(f64(relgrad, q[0, 0]), f64(relgrad, table_k[0]).T)
    qe_r = relgrad.gather(qe, 1, r).numpy()
    s_row = c * (qk[row] + qe_r[row])
    r_row = r.numpy()[row]
    visible = relgrad.nn.pattern_mask(L, L, causal=True).numpy()

    # the online softmax over the key tiles (fused_attention.md, "The forward")
    m, l, acc, N = -np.inf, 0.0, np.zeros(Dh), np.zeros(K)
    history = []  # per visited tile: (j0, j1, m, alpha, N)
    for j0 in range(0, L, key_tile):
        j1 = min(L, j0 + key_tile)
        seen = visible[row, j0:j1]
        if not seen.any():
            continue
        s = np.where(seen, s_row[j0:j1], -np.inf)
        new_max = max(m, s.max())
        alpha = 0.0 if m == -np.inf else np.exp(m - new_max)
        p = np.exp(s - new_max)
        l = alpha * l + p.sum()
        acc = alpha * acc + p @ v[0, 0, j0:j1]
        N = alpha * N + np.bincount(r_row[j0:j1], weights=p, minlength=K)
        m = new_max
        history.append((j0, j1, m, alpha, N.copy()))
    z_row = (acc + N @ table_v[0]) / l
    z = relgrad.fused_attention(f64(relgrad, q), f64(relgrad, keys), f64(relgrad, v), causal=True,
                                table_k=f64(relgrad, table_k), table_v=f64(relgrad, table_v),
                                k_left=k, k_right=k).numpy()
    assert np.allclose(z_row, z[0, 0, row], rtol=0, atol=1e-12), "the recurrence disagrees with fused_attention"
    assert sum(1 for h in history if h[3] not in (0.0, 1.0)) >= 2, "the max should move in two tiles or more"

    fig = plt.figure(figsize=(7.6, 5.0))
    grid = fig.add_gridspec(2, 2, width_ratios=(1, 1.55), height_ratios=(1, 1))
    ax_tiles = fig.add_subplot(grid[:, 0])
    ax_row = fig.add_subplot(grid[0, 1])
    ax_n = fig.add_subplot(grid[1, 1])

    # (a) the tiles of one (batch, head): skipped where the causal rule hides every pair
    focus = row // query_tile
    faces, skipped = [], []
    for qt in range(L // query_tile):
        i0 = qt * query_tile
        seen = [visible[i0:i0 + query_tile, j0:j0 + key_tile].any() for j0 in range(0, L, key_tile)]
        faces.append([("#cfe3f5" if qt == focus else "#ffffff") if any_seen else None for any_seen in seen])
        skipped.append([None if any_seen else "#e6e6e6" for any_seen in seen])
    draw_cells(plt, ax_tiles, faces, edgecolor="#999999", linewidth=0.4, size=(key_tile, query_tile))
    draw_cells(plt, ax_tiles, skipped, edgecolor="#999999", linewidth=0.4, hatch="////", size=(key_tile, query_tile))
    ax_tiles.plot([0, L], [0, L], color="black", linewidth=0.6)
    ax_tiles.plot([0, row], [row, row], color="#d62728", linewidth=1.2)
    for n in range(L // key_tile):
        ax_tiles.text((n + 0.5) * key_tile, (focus + 0.5) * query_tile, str(n + 1), ha="center", va="center",
                      fontsize=7, color="#1f4e79", fontweight="bold")
    ax_tiles.set_xlim(0, L)
    ax_tiles.set_ylim(L, 0)
    ax_tiles.set_xticks(range(0, L + 1, key_tile))
    ax_tiles.set_yticks(range(0, L + 1, 4 * query_tile))
    ax_tiles.set_xlabel("key j")
    ax_tiles.set_ylabel("query i")
    ax_tiles.set_title(f"(a) causal, L = {L}: tiles of {query_tile} queries x {key_tile} keys;\n"
                       f"hatched: skipped. Blue: one task, keys in order 1-4;\nred: row i = {row}",
                       loc="left")

    # (b) the row's scores and its running max m
    j = np.arange(row + 1)
    ax_row.plot(j, s_row[:row + 1], color="#7f7f7f", linewidth=0.4)
    for n, (j0, j1, m_after, alpha, _) in enumerate(history):
        end = min(j1, row + 1)
        ax_row.plot([j0, end], [m_after, m_after], color="#d62728", linewidth=1.4)
        ax_row.axvline(j0, color="#1f4e79", linewidth=0.5, linestyle=":")
        label = "alpha = 0" if alpha == 0 else f"alpha = {alpha:.3g}"
        ax_row.text((j0 + end) / 2, m_after + 0.25, f"tile {n + 1}: m = {m_after:.2f}\n{label}", ha="center",
                    va="bottom", fontsize=6.5, color="#d62728")
    low, high = s_row[:row + 1].min(), max(h[2] for h in history)
    ax_row.set_ylim(low - 0.3, high + 1.6)
    ax_row.set_xlim(0, L)
    ax_row.set_xticks(range(0, L + 1, key_tile))
    ax_row.set_xlabel("key j")
    ax_row.set_ylabel("s_ij")
    ax_row.set_title(f"(b) row i = {row}: scores s_ij (grey) and the running max m (red);\n"
                     "alpha = exp(m - m') rescales l, acc and N when m moves", loc="left")

    # (c) the bucket sums N_i[r] after each tile, and P_i = N_i / l_i at the end
    rows = [h[4] for h in history] + [N / l]
    labels = [f"after tile {n + 1}" for n in range(len(history))] + ["P_i = N_i / l_i"]
    shown = np.array(rows)
    draw_cells(plt, ax_n, colors_of(plt, np.log10(np.maximum(shown, 1e-3)), "Blues", -3,
                                    np.log10(shown.max()) + 0.5, 12))
    for a, values in enumerate(rows):
        for b, value in enumerate(values):
            ax_n.text(b + 0.5, a + 0.5, "0" if value == 0 else f"{value:.2g}", ha="center", va="center", fontsize=6.5)
    ax_n.set_xlim(0, K)
    ax_n.set_ylim(len(rows), 0)
    ax_n.set_xticks(np.arange(K) + 0.5, [str(b) for b in range(K)])
    ax_n.set_yticks(np.arange(len(rows)) + 0.5, labels)
    ax_n.tick_params(length=0)
    ax_n.spines[:].set_visible(False)
    ax_n.set_xlabel(f"bucket r: 0 holds j - i <= -{k}; {k + 1} .. {K - 1} (keys after i) are hidden")
    ax_n.set_title("(c) the row's running bucket sums N_i[r], sums of exp(s_ij - m)", loc="left")
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------- the gate between relative and absolute


def gate_mix(relgrad, plt):
    """GatedPositionAttention's weights at three gates, on a sequence of one repeated token, so that
    the content term q_i . k_j is 0 and the position terms alone decide (read from the layer's own
    last_weights)."""
    D, L, k = 4, 12, 3
    K = 2 * k + 1
    layer = relgrad.nn.GatedPositionAttention(D, 1, k=k, attention="reference", seed=0, dtype="float64")
    state = {name: np.array(value) for name, value in layer.state_dict().items()}
    state["w_q.weight"] = 2 * np.eye(D)        # q_i = 2 x_i
    state["w_k.weight"] = np.zeros((D, D))     # k_j = 0: no content term
    state["w_k.bias"] = np.zeros(D)
    profile = np.array([-1.0, -0.5, 3.0, 0.5, 0.0, -0.5, -1.0])  # c q . E_K[r] per bucket: peaks at d = -1
    table = np.zeros((K, D))
    table[:, 0] = profile                      # c = 1/2 and q = (2, 0, 0, 0): c q . E_K[r] = profile[r]
    state["rel_pos_emb_k.weight"] = table
    state["w_pq.weight"] = 2.5 * randn(relgrad, D, D, seed=21)
    state["w_pk.weight"] = 2.5 * randn(relgrad, D, D, seed=22)
    x = np.zeros((1, L, D))
    x[..., 0] = 1                              # every token the same vector
    gates = [(-40.0, "g_h = 0 (lambda = -40): absolute"), (0.0, "g_h = 0.5 (lambda = 0): both"),
             (40.0, "g_h = 1 (lambda = 40): relative")]
    fig, axes = plt.subplots(1, 4, figsize=(8.0, 2.4), gridspec_kw={"width_ratios": (1, 1, 1, 0.9)})
    for ax, (logit, title) in zip(axes, gates):
        state["gate"] = np.array([logit])
        layer.load_state_dict(state)
        layer(f64(relgrad, x))
        weights = layer.last_weights.numpy()[0, 0]
        if logit > 0:  # g_h = 1: the scores are profile[r(i, j)], the same on every diagonal
            r = relgrad.nn.RelativePositionEmbedding(1, k=k).index(L, L).numpy()
            scores = profile[r]
            expected = np.exp(scores - scores.max(axis=1, keepdims=True))
            assert np.allclose(weights, expected / expected.sum(axis=1, keepdims=True), atol=1e-12)
        draw_cells(plt, ax, colors_of(plt, weights, "magma_r", 0, 1, 10), linewidth=0.3)
        ax.set_xlim(0, L)
        ax.set_ylim(L, 0)
        ax.set_aspect("equal")
        ax.set_xticks([0, L // 2, L])
        ax.set_yticks([0, L // 2, L])
        ax.set_xlabel("key j")
        ax.set_title(f"a_ij, {title}", fontsize=7)
    axes[0].set_ylabel("query i")
    # the gate itself: g_h = sigmoid(lambda_h), as gate_values() reports it
    logits = np.linspace(-6, 6, 49)
    values = []
    for logit in logits:
        state["gate"] = np.array([logit])
        layer.load_state_dict(state)
        values.append(layer.gate_values()[0])
    assert np.allclose(values, 1 / (1 + np.exp(-logits)), atol=1e-15)
    axes[3].plot(logits, values, color="#1f4e79")
    axes[3].set_xlabel("lambda_h (`gate`)")
    axes[3].set_ylabel("g_h = sigmoid(lambda_h)")
    axes[3].set_title("the gate: 1 relative, 0 absolute", fontsize=7)
    axes[3].set_ylim(0, 1)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------- T5's buckets


def t5_buckets(relgrad, plt):
    """bucket(d) at the defaults, both directions and causal, from relgrad.nn.t5_bucket"""
    layer = relgrad.nn.T5BiasAttention(8, 2)
    nb, max_distance = layer.num_buckets, layer.max_distance
    d = np.arange(-160, 161)
    both = np.array([relgrad.nn.t5_bucket(int(x), True, nb, max_distance) for x in d])
    causal = np.array([relgrad.nn.t5_bucket(int(x), False, nb, max_distance) for x in d])
    fig, ax = plt.subplots(figsize=(6.4, 2.6))
    exact = nb // 4  # bidirectional: nb / 2 buckets a side, the first half of them one per distance
    ax.axvspan(-exact + 0.5, exact - 0.5, color="#e8f1e4", zorder=0)
    ax.step(d, both, where="mid", color="#1f77b4", linewidth=1.1, label="bidirectional")
    ax.step(d, causal, where="mid", color="#ff7f0e", linewidth=1.1, linestyle="--",
            label="causal (keys after the query: bucket 0)")
    for x in (-max_distance, max_distance):
        ax.axvline(x, color="#7f7f7f", linewidth=0.6, linestyle=":")
    ax.text(max_distance + 2, 2, f"max_distance\n= {max_distance}", fontsize=6.5, color="#555555")
    ax.text(0, nb - 1.5, f"bidirectional: one bucket\nper distance (|d| < {exact})", ha="center", va="top", fontsize=6.5,
            color="#2e6b1f")
    ax.set_xlim(d[0], d[-1])
    ax.set_ylim(-0.5, nb + 0.5)
    ax.set_xlabel("distance d = j - i (key j, query i)")
    ax.set_ylabel("bucket(d): the row of W_T5")
    ax.set_title(f"T5's buckets at the defaults: {nb} buckets, max_distance {max_distance}")
    ax.legend(loc="center right", frameon=False)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------- RoPE's rotation


def rope_rotation(relgrad, plt):
    """relgrad.rope on one vector placed at positions 0..6: each pair turns by p theta_t; and the
    turned query and key meet at an angle that depends on j - i alone"""
    Dh, positions = 8, 7
    theta = 10000.0 ** (-2 * np.arange(Dh // 2) / Dh)
    x = np.tile([1.0, 0.0] * (Dh // 2), (positions, 1))  # the same vector at every position
    turned = relgrad.rope(f64(relgrad, x)).numpy()       # row p: x turned to position p
    fig, axes = plt.subplots(1, 3, figsize=(8.0, 2.7), gridspec_kw={"width_ratios": (1, 1, 1.5)})
    colors = plt.get_cmap("viridis")(np.linspace(0, 0.9, positions))
    for ax, t in zip(axes[:2], (0, 1)):
        ax.add_patch(plt.Circle((0, 0), 1, fill=False, color="#cccccc", linewidth=0.6))
        for p in range(positions):
            pair = turned[p, 2 * t:2 * t + 2]
            assert np.allclose(pair, [np.cos(p * theta[t]), np.sin(p * theta[t])], atol=1e-15)
            ax.annotate("", xy=pair, xytext=(0, 0),
                        arrowprops={"arrowstyle": "-|>", "color": colors[p], "linewidth": 1, "shrinkA": 0,
                                    "shrinkB": 0})
            ax.text(1.13 * pair[0], 1.13 * pair[1], f"p={p}", fontsize=6, ha="center", va="center", color=colors[p])
        ax.set_xlim(-1.3, 1.3)
        ax.set_ylim(-1.3, 1.3)
        ax.set_aspect("equal")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.spines[:].set_visible(False)
        ax.set_title(f"pair t = {t}: theta_{t} = {theta[t]:g} rad per position", fontsize=7)
    # q'_i . k'_j for two query positions: one curve in j - i
    q = randn(relgrad, Dh, seed=31)
    k = randn(relgrad, Dh, seed=32)
    L = 40
    q_turned = relgrad.rope(f64(relgrad, np.tile(q, (L, 1)))).numpy()
    k_turned = relgrad.rope(f64(relgrad, np.tile(k, (L, 1)))).numpy()
    products = q_turned @ k_turned.T  # [i, j] = q'_i . k'_j
    ax = axes[2]
    for i, style in ((5, "-"), (30, "--")):
        ax.plot(np.arange(L) - i, products[i], style, linewidth=1.1, label=f"query at i = {i}")
    overlap = np.arange(-5, L - 30)  # distances both rows reach
    assert np.allclose(products[5, 5 + overlap], products[30, 30 + overlap], atol=1e-12)
    ax.axhline(q @ k, color="black", linewidth=0.5)
    ax.set_xlabel("j - i")
    ax.set_ylabel("q'_i . k'_j")
    ax.set_title(f"one q and one k, Dh = {Dh}: the same curve for every i", fontsize=7)
    ax.legend(frameon=False)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------- ALiBi's biases per head


def alibi_biases(relgrad, plt):
    """-m_h |d| per head, read back from an AlibiAttention layer: with every query 0 its scores are
    the bias alone, so log(a_ij / a_ii) = -m_h |j - i|"""
    D, H, L = 8, 8, 33
    layer = relgrad.nn.AlibiAttention(D, H, attention="reference", seed=0, dtype="float64")
    state = {name: np.array(value) for name, value in layer.state_dict().items()}
    state["w_q.weight"] = np.zeros((D, D))
    state["w_q.bias"] = np.zeros(D)
    layer.load_state_dict(state)
    layer(f64(relgrad, randn(relgrad, 1, L, D, seed=41)))
    weights = layer.last_weights.numpy()[0]  # [H, L, L]
    i = L // 2
    d = np.arange(L) - i
    fig, ax = plt.subplots(figsize=(6.4, 2.7))
    colors = plt.get_cmap("viridis")(np.linspace(0, 0.9, H))
    for h in range(H):
        bias = np.log(weights[h, i] / weights[h, i, i])
        assert np.allclose(bias, -layer.slopes[h] * np.abs(d), atol=1e-12)
        slope = layer.slopes[h]
        ax.plot(d, bias, color=colors[h], linewidth=1.1,
                label=f"head {h + 1}: m = 1/{round(1 / slope)}")
    ax.set_xlim(d[0], d[-1])
    ax.set_xlabel("distance d = j - i")
    ax.set_ylabel("bias -m_h |d| added to s_ij")
    ax.set_title(f"ALiBi, H = {H}: each head's bias, read back from the layer's weights (query i = {i})")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------- the autograd graph


def autograd_graph(relgrad, plt):
    """The graph of engine.md's worked example, c = a * b, d = c + a, L = d * d, read from the
    tensors: each one's grad_fn (a Node: its op's name and its inputs) gives the edges, and
    relgrad.topological_order gives the order backward() walks. Only the names a, b, c, d, L are
    this script's (a tensor has no name); the values and gradients are the engine's."""
    a = relgrad.tensor(2.0, dtype="float64", requires_grad=True)
    b = relgrad.tensor(-3.0, dtype="float64", requires_grad=True)
    c = a * b
    d = c + a
    L = d * d
    names = {a._id: "a", b._id: "b", c._id: "c", d._id: "d", L._id: "L"}
    order = relgrad.topological_order(L)  # each tensor after its inputs, the root last
    assert sorted(t._id for t in order) == sorted(names), "the graph holds other tensors than a, b, c, d, L"
    edges, ops = [], {}
    for tensor in order:
        node = tensor.grad_fn
        if node is None:
            continue
        ops[tensor._id] = node.name
        for n, source in enumerate(node.inputs):
            edges.append((source._id, tensor._id, n))
    depth = {}
    for tensor in order:  # inputs first, so each input's depth is known
        node = tensor.grad_fn
        sources = [] if node is None else [s._id for s in node.inputs]
        depth[tensor._id] = 0 if not sources else 1 + max(depth[s] for s in sources)
    walk = [names[t._id] for t in reversed(order)]
    assert walk == ["L", "d", "c", "b", "a"], walk

    for t in (c, d):
        t.retain_grad()
    L.backward()
    values = {t._id: (t.item(), t.grad.item()) for t in (a, b, c, d, L) if t.grad is not None}
    values[L._id] = (L.item(), 1.0)  # the seed, dL/dL
    assert (values[a._id][1], values[b._id][1], values[c._id][1], values[d._id][1]) == (16, -16, -8, -8)

    x_of = {tid: 2.6 * depth[tid] for tid in names}
    y_of = {a._id: 0.0, b._id: -1.4, c._id: -0.7, d._id: 0.0, L._id: 0.0}
    fig, ax = plt.subplots(figsize=(7.2, 2.5))
    for tid, name in names.items():
        value, grad = values[tid]
        ax.text(x_of[tid], y_of[tid], f"{name} = {value:g}\ngrad {grad:g}", ha="center", va="center", fontsize=8,
                bbox={"boxstyle": "round,pad=0.35", "facecolor": "#dde8f6" if tid in (a._id, b._id) else "white",
                      "edgecolor": "#1f4e79"})
        step = walk.index(name) + 1
        ax.text(x_of[tid], y_of[tid] + 0.42, f"backward step {step}", ha="center", fontsize=6.5, color="#d62728")
    for tid, op in ops.items():  # the op sits halfway between its output and the column before
        ax.text(x_of[tid] - 1.3, y_of[tid], op, ha="center", va="center", fontsize=7.5, style="italic",
                bbox={"boxstyle": "round4,pad=0.3", "facecolor": "#f4f4f4", "edgecolor": "#7f7f7f"})
    for source, target, n in edges:
        start = (x_of[source] + 0.45, y_of[source])
        end = (x_of[target] - 1.3 - 0.35, y_of[target])
        bend = 0.0
        twins = [e for e in edges if e[0] == source and e[1] == target]
        if len(twins) > 1:  # d * d: the same input twice
            bend = 0.35 if n == 0 else -0.35
        ax.annotate("", xy=end, xytext=start,
                    arrowprops={"arrowstyle": "-|>", "color": "#555555", "linewidth": 0.8,
                                "connectionstyle": f"arc3,rad={bend}", "shrinkA": 2, "shrinkB": 2})
    for tid in ops:
        ax.annotate("", xy=(x_of[tid] - 0.5, y_of[tid]), xytext=(x_of[tid] - 1.3 + 0.3, y_of[tid]),
                    arrowprops={"arrowstyle": "-|>", "color": "#555555", "linewidth": 0.8, "shrinkA": 2,
                                "shrinkB": 2})
    ax.set_xlim(-0.8, max(x_of.values()) + 0.8)
    ax.set_ylim(-1.9, 0.75)
    ax.axis("off")
    ax.set_title("c = a * b,  d = c + a,  L = d * d: the forward runs left to right, backward from L; "
                 "a's two shares, -8 through d and 24 through c, sum to 16", fontsize=7.5)
    fig.tight_layout()
    return fig


def compact_svg(svg):
    """matplotlib's SVG with the coordinates of its paths and texts rounded to 1/100 of a point,
    and without the no-op rotate(-0 ...) of every horizontal text: a third smaller, the same
    picture (the texts themselves are left as they are)"""
    def rounded(match):
        text = f"{float(match.group(0)):.2f}".rstrip("0").rstrip(".")
        return "0" if text == "-0" else text

    def attribute(match):
        return match.group(1) + re.sub(r"-?\d+\.\d{3,}", rounded, match.group(2)) + '"'

    svg = re.sub(r' transform="rotate\(-0 [-0-9.]+ [-0-9.]+\)"', "", svg)
    return re.sub(r'( (?:d|x|y|transform)=")([^"]*)"', attribute, svg)


FIGURES = [
    ("relative_index", relative_index),
    ("fused_tile_walk", fused_tile_walk),
    ("gate_mix", gate_mix),
    ("t5_buckets", t5_buckets),
    ("rope_rotation", rope_rotation),
    ("alibi_biases", alibi_biases),
    ("autograd_graph", autograd_graph),
]


def main():
    args = parse_args()
    relgrad, plt = import_libraries(args.build)
    os.makedirs(args.out, exist_ok=True)
    for name, draw in FIGURES:
        fig = draw(relgrad, plt)
        path = os.path.join(args.out, name + ".svg")
        svg = io.StringIO()
        fig.savefig(svg, format="svg", metadata={"Date": None, "Creator": None})
        plt.close(fig)
        with open(path, "w", newline="\n") as out:
            out.write(compact_svg(svg.getvalue()))
        print(f"{path}: {os.path.getsize(path):,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
