#!/usr/bin/env python3
"""Plots of the experiments (scripts/experiments.py) into docs/results/, from their JSON outputs.

    python3 scripts/plot_results.py

- EXP_loss.png: training loss per variant (first seed), from metrics.jsonl
- EXP_by_length.png: the metric per length bucket (BLEU for translation), mean over seeds with
  error bars of one standard deviation, cut at the metric's range ([0, 1] for accuracy and BLEU)
- translation_bleu_vs_k.png: BLEU against the clipping distance k (sinusoidal as a line)
- gates.png: the learned gate g = sigmoid(lambda) per layer and head of the gated runs (1: relative)
- gates_over_training.png: the gates of the gates experiment over training, every seed
- sequence_by_length.png: exact match and token accuracy per length of copy, reverse and dedupe
- EXP_relative_table.png: the relative key table E_K of layer 0 (first seed), buckets x head dims
- length_attention.png: the last layer's attention maps of the length-task models (first seed) on
  one 32-token input with marker A at position 10 and B at 13, written by `relgrad attention`
"""
import glob
import json
import os
import subprocess
import tempfile

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

OUT = "docs/results"


def load(experiment):
    path = os.path.join("runs", "experiments", experiment, "results.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def loss_curves(experiment, results):
    plt.figure(figsize=(6, 4))
    for variant, r in results.items():
        path = os.path.join("runs", "experiments", experiment, variant, f"seed{r['seeds'][0]}", "metrics.jsonl")
        steps, losses = [], []
        with open(path) as f:
            for line in f:
                row = json.loads(line)
                if "loss" in row:
                    steps.append(row["step"])
                    losses.append(row["loss"])
        plt.plot(steps, losses, label=variant, linewidth=1)
    plt.xlabel("step")
    plt.ylabel("training loss")
    plt.title(f"{experiment}: training loss (seed {next(iter(results.values()))['seeds'][0]})")
    plt.legend(fontsize=7)
    plt.tight_layout()
    plt.savefig(os.path.join(OUT, f"{experiment}_loss.png"), dpi=120)
    plt.close()


# The values a metric can take: mean ± std may leave them (a seed at 1.0 and one at chance give a
# std that reaches past 1), so the error bars are cut there.
METRIC_RANGE = {"accuracy": (0.0, 1.0), "bleu": (0.0, 1.0)}


def error_bars(means, stds, metric):
    """yerr for plt.errorbar: mean - std and mean + std, cut at the metric's range."""
    low, high = METRIC_RANGE.get(metric, (-np.inf, np.inf))
    below = [m - max(m - s, low) for m, s in zip(means, stds)]
    above = [min(m + s, high) - m for m, s in zip(means, stds)]
    return [below, above]


def by_length(experiment, results):
    metric = next(iter(results.values()))["metric"]
    plt.figure(figsize=(6, 4))
    for variant, r in results.items():
        buckets = sorted(r["by_length"], key=lambda name: int(name.split("-")[0].lstrip(">")))
        means = [r["by_length"][b]["mean"] for b in buckets]
        stds = [r["by_length"][b]["std"] for b in buckets]
        plt.errorbar(range(len(buckets)), means, yerr=error_bars(means, stds, metric), label=variant, capsize=2,
                     linewidth=1)
        plt.xticks(range(len(buckets)), buckets)
    plt.xlabel("length bucket")
    plt.ylabel({"bleu": "BLEU"}.get(metric, metric))
    cut = f", cut to [{METRIC_RANGE[metric][0]:g}, {METRIC_RANGE[metric][1]:g}]" if metric in METRIC_RANGE else ""
    plt.title(f"{experiment}: by length (mean ± std over seeds{cut})", fontsize=10)
    plt.legend(fontsize=7)
    plt.tight_layout()
    plt.savefig(os.path.join(OUT, f"{experiment}_by_length.png"), dpi=120)
    plt.close()


def bleu_vs_k(results):
    ks, means, stds = [], [], []
    for variant, r in results.items():
        if variant.startswith("relative-k"):
            ks.append(int(variant[len("relative-k"):]))
            means.append(r["bleu"]["mean"])
            stds.append(r["bleu"]["std"])
    plt.figure(figsize=(5, 3.5))
    plt.errorbar(ks, means, yerr=error_bars(means, stds, "bleu"), marker="o", capsize=3, label="relative")
    if "sinusoidal" in results:
        plt.axhline(results["sinusoidal"]["bleu"]["mean"], color="gray", linestyle="--", label="sinusoidal")
    plt.xscale("log", base=2)
    plt.xlabel("clipping distance k")
    plt.ylabel("BLEU")
    plt.legend()
    plt.tight_layout()
    plt.savefig(os.path.join(OUT, "translation_bleu_vs_k.png"), dpi=120)
    plt.close()


def gates(all_results):
    rows, labels = [], []
    for experiment, results in all_results.items():
        for variant, r in results.items():
            if "gates" in r:
                first_seed = np.array(r["gates"][0])  # [layers, heads]
                for layer, values in enumerate(first_seed):
                    rows.append(values)
                    labels.append(f"{experiment}/{variant} L{layer}")
    if not rows:
        return
    plt.figure(figsize=(5, 0.35 * len(rows) + 1.2))
    plt.imshow(np.array(rows), vmin=0, vmax=1, cmap="coolwarm", aspect="auto")
    plt.yticks(range(len(rows)), labels, fontsize=7)
    plt.xlabel("head")
    plt.colorbar(label="g (1 = relative, 0 = absolute)")
    plt.title("learned gates (first seed)")
    plt.tight_layout()
    plt.savefig(os.path.join(OUT, "gates.png"), dpi=120)
    plt.close()


def gates_over_training(results):
    """gates_over_training.png: g per layer and head over training, one panel per task and gate
    learning rate, every seed (the evaluation lines of metrics.jsonl carry the gates)."""
    tasks = sorted({variant.split("/")[0] for variant in results})
    scales = list(dict.fromkeys(variant.split("/")[1] for variant in results))  # in the experiment's order
    fig, axes = plt.subplots(len(tasks), len(scales), figsize=(3.3 * len(scales), 2.6 * len(tasks)), sharey=True,
                             squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for row, task in enumerate(tasks):
        for col, scale in enumerate(scales):
            ax = axes[row][col]
            r = results.get(f"{task}/{scale}")
            if r is None:
                continue
            for seed in r["seeds"]:
                steps, gates = [], []
                with open(os.path.join("runs", "experiments", "gates", task, scale, f"seed{seed}", "metrics.jsonl")) as f:
                    for line in f:
                        entry = json.loads(line)
                        if "gates" in entry:
                            steps.append(entry["step"])
                            gates.append(entry["gates"])
                gates = np.array(gates)  # [evaluations, layers, heads]
                for layer in range(gates.shape[1]):
                    for head in range(gates.shape[2]):
                        ax.plot(steps, gates[:, layer, head], color=colors[layer], linewidth=0.7, alpha=0.7,
                                label=f"layer {layer}" if seed == r["seeds"][0] and head == 0 else None)
            ax.axhline(0.5, color="gray", linewidth=0.5, linestyle=":")
            ax.set_ylim(0, 1)
            ax.set_title(f"{task}, {scale}", fontsize=9)
            if col == 0:
                ax.set_ylabel("g (1 relative, 0 absolute)", fontsize=8)
            if row == len(tasks) - 1:
                ax.set_xlabel("step", fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("gates per layer and head over training (every head of every seed)", fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.join(OUT, "gates_over_training.png"), dpi=110)
    plt.close(fig)


def sequence_by_length(results):
    """sequence_by_length.png: exact match and token accuracy per length bucket, a column per task."""
    tasks = sorted({variant.split("/")[0] for variant in results})
    fig, axes = plt.subplots(2, len(tasks), figsize=(4.2 * len(tasks), 6.4), sharey=True, squeeze=False)
    for col, task in enumerate(tasks):
        for variant, r in results.items():
            if not variant.startswith(task + "/"):
                continue
            buckets = sorted(r["by_length_metrics"], key=lambda name: int(name.split("-")[0].lstrip(">")))
            for row, key in enumerate(("accuracy", "token_accuracy")):
                means = [r["by_length_metrics"][b][key]["mean"] for b in buckets]
                stds = [r["by_length_metrics"][b][key]["std"] for b in buckets]
                axes[row][col].errorbar(range(len(buckets)), means, yerr=error_bars(means, stds, "accuracy"),
                                        label=variant.split("/")[1], capsize=2, linewidth=1)
                axes[row][col].set_xticks(range(len(buckets)), buckets, fontsize=7)
        axes[0][col].set_title(task)
        axes[1][col].set_xlabel("source length (trained on 4-16)")
    axes[0][0].set_ylabel("exact match")
    axes[1][0].set_ylabel("token accuracy")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle("sequence tasks by length (mean ± std over seeds, cut to [0, 1])", fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.join(OUT, "sequence_by_length.png"), dpi=110)
    plt.close(fig)


def relative_table(experiment, results):
    for variant, r in results.items():
        pattern = os.path.join("runs", "experiments", experiment, variant, f"seed{r['seeds'][0]}", "checkpoint", "model",
                               "*layers.0.self_attention.rel_pos_emb_k.weight.npy")
        files = glob.glob(pattern)
        if files:
            table = np.load(files[0])
            plt.figure(figsize=(5, 3.5))
            plt.imshow(table, cmap="RdBu", aspect="auto")
            plt.ylabel("bucket r (distance + k)")
            plt.xlabel("head dimension")
            plt.colorbar()
            plt.title(f"{experiment}/{variant}: E_K of layer 0")
            plt.tight_layout()
            plt.savefig(os.path.join(OUT, f"{experiment}_relative_table.png"), dpi=120)
            plt.close()
            return


def attention_maps(results, relgrad="build/relgrad"):
    symbols = [6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    tokens = [symbols[i % len(symbols)] for i in range(32)]
    tokens[10], tokens[13] = 4, 5  # A three positions before B: a positive example
    prompt = " ".join(map(str, tokens))
    variants = list(results)
    maps = {}
    with tempfile.TemporaryDirectory() as work:
        for variant in variants:
            run = os.path.join("runs", "experiments", "length", variant, f"seed{results[variant]['seeds'][0]}")
            out = os.path.join(work, variant)
            done = subprocess.run([relgrad, "attention", run, "--prompt", prompt, "--out", out], capture_output=True, text=True)
            if done.returncode != 0:
                print("attention maps skipped:", done.stderr.strip())
                return
            last = sorted(glob.glob(os.path.join(out, "layer*.npy")))[-1]
            maps[variant] = np.load(last)  # [H, L, L]
    heads = next(iter(maps.values())).shape[0]
    fig, axes = plt.subplots(len(variants), heads, figsize=(2.2 * heads, 2.2 * len(variants)))
    for row, variant in enumerate(variants):
        for head in range(heads):
            ax = axes[row][head]
            ax.imshow(maps[variant][head], cmap="viridis", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if head == 0:
                ax.set_ylabel(variant)
            if row == 0:
                ax.set_title(f"head {head}", fontsize=9)
    fig.suptitle("length task: last layer's attention (query rows, key columns), A at 10, B at 13", fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(OUT, "length_attention.png"), dpi=110)
    plt.close(fig)


def main():
    os.makedirs(OUT, exist_ok=True)
    all_results = {}
    for experiment in ("length", "sentiment", "translation", "translation-long", "translation-length"):
        results = load(experiment)
        if results is None:
            continue
        all_results[experiment] = results
        loss_curves(experiment, results)
        by_length(experiment, results)
        if experiment in ("length", "sentiment", "translation"):  # the others: the same kind as translation's
            relative_table(experiment, results)
        if experiment == "translation":
            bleu_vs_k(results)
        if experiment == "length":
            attention_maps(results)
    gates(all_results)
    if load("gates"):
        gates_over_training(load("gates"))
    if load("sequence"):
        sequence_by_length(load("sequence"))
    print("plots in", OUT)


if __name__ == "__main__":
    main()
