#!/usr/bin/env python3
"""Plots of the experiments (scripts/experiments.py) into docs/results/, from the records of their
runs in docs/results/data/ (no run directory or relgrad program is needed). One file: every plot
of docs/results/, one function each, reading the same records.

    python3 scripts/plot_results.py

- EXP_loss.png: training loss per variant (first seed)
- EXP_by_length.png: the metric per length bucket (BLEU for translation), mean over seeds with
  error bars of one standard deviation, cut at the metric's range ([0, 1] for accuracy and BLEU)
- translation_bleu_vs_k.png: BLEU against the clipping distance k, with and without the
  value-side term (sinusoidal as a line)
- translation_bleu_over_training.png: the test BLEU of every evaluation, every seed
- gates.png: the learned gate g = sigmoid(lambda) per layer and head of the gated runs (1: relative)
- gates_over_training.png: the gates of the gates experiment over training, every seed
- sequence_by_length.png: exact match and token accuracy per length of copy, reverse and dedupe
- EXP_relative_table.png: the relative key table E_K of layer 0 (first seed), buckets x head dims
  (translation: the encoder's and the decoder's)
- length_attention.png: the last layer's attention maps of the length-task models (first seed) on
  one 32-token input with marker A at position 10 and B at 13 (`relgrad attention`, kept in the
  records)
- sentiment_attention.png, translation_attention.png: the same for Yelp sentiment models and for
  translation models (the encoder) on one sentence each
- family_by_length.png: the relative family's exact match and token accuracy per prompt length, a
  column per task, with the paper's released per-length numbers (Kazemnejad et al. 2023) below
- family_mrr.png: the mean reciprocal rank of the schemes, as the paper's Figure 1 ranks them, here
  and in the paper; the tables of docs/results.md section 6 are printed
"""
import functools
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

OUT = "docs/results"
DATA = os.path.join(OUT, "data")


def save(name, fig=None, dpi=120):
    """Lays the figure out (the current one unless given) and writes it to OUT/name."""
    fig = fig or plt.gcf()
    fig.tight_layout()
    fig.savefig(os.path.join(OUT, name), dpi=dpi)
    plt.close(fig)


def load(experiment):
    path = os.path.join(DATA, experiment, "results.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


@functools.cache
def record(experiment, variant, seed):
    """One run's record, written by scripts/experiments.py: summary, metrics, relative table, attention."""
    with open(os.path.join(DATA, experiment, variant, f"seed{seed}.json")) as f:
        return json.load(f)


def loss_curves(experiment, results):
    plt.figure(figsize=(6, 4))
    for variant, r in results.items():
        rows = [row for row in record(experiment, variant, r["seeds"][0])["metrics"] if "loss" in row]
        steps, losses = [row["step"] for row in rows], [row["loss"] for row in rows]
        plt.plot(steps, losses, label=variant, linewidth=1)
    plt.xlabel("step")
    plt.ylabel("training loss")
    plt.title(f"{experiment}: training loss (seed {next(iter(results.values()))['seeds'][0]})")
    plt.legend(fontsize=7)
    save(f"{experiment}_loss.png")


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
    save(f"{experiment}_by_length.png")


def bleu_vs_k(results):
    """BLEU against k for relative-k<k> (key and value terms) and relative-k<k>-keys (key term only);
    k = 0 is one bucket for every distance, so the x axis is categorical."""
    ks = sorted({int(variant[len("relative-k"):].removesuffix("-keys")) for variant in results
                 if variant.startswith("relative-k")})
    plt.figure(figsize=(5.5, 3.8))
    for suffix, label in (("", "relative (keys and values)"), ("-keys", "relative (keys only)")):
        present = [k for k in ks if f"relative-k{k}{suffix}" in results]
        means = [results[f"relative-k{k}{suffix}"]["bleu"]["mean"] for k in present]
        stds = [results[f"relative-k{k}{suffix}"]["bleu"]["std"] for k in present]
        if present:
            plt.errorbar([ks.index(k) for k in present], means, yerr=error_bars(means, stds, "bleu"), marker="o",
                         capsize=3, label=label)
    if "sinusoidal" in results:
        plt.axhline(results["sinusoidal"]["bleu"]["mean"], color="gray", linestyle="--", label="sinusoidal")
    plt.xticks(range(len(ks)), ks)
    plt.xlabel("clipping distance k")
    plt.ylabel("BLEU (mean ± std over seeds)")
    plt.legend(fontsize=8)
    save("translation_bleu_vs_k.png")


def bleu_over_training(experiment, results):
    """The test BLEU of every evaluation during training, every seed of every variant."""
    plt.figure(figsize=(6, 4))
    for index, (variant, r) in enumerate(results.items()):
        for n, seed in enumerate(r["seeds"]):
            rows = [row for row in record(experiment, variant, seed)["metrics"] if "eval" in row]
            steps, bleus = [row["step"] for row in rows], [row["eval"]["bleu"] for row in rows]
            plt.plot(steps, bleus, color=f"C{index % 10}", linewidth=1, marker=".",
                     linestyle="-" if index < 10 else "--", label=variant if n == 0 else None)
    plt.xlabel("step")
    plt.ylabel("test BLEU")
    plt.title(f"{experiment}: BLEU over training (every seed)", fontsize=10)
    plt.legend(fontsize=7)
    save(f"{experiment}_bleu_over_training.png")


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
    save("gates.png")


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
                rows = [row for row in record("gates", f"{task}/{scale}", seed)["metrics"] if "gates" in row]
                steps = [row["step"] for row in rows]
                gates = np.array([row["gates"] for row in rows])  # [evaluations, layers, heads]
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
    save("gates_over_training.png", fig, dpi=110)


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
    save("sequence_by_length.png", fig, dpi=110)


def relative_table(experiment, results):
    """The first relative model's table, a k = 8 one where there is one (k = 0 has one row); for
    pairs, the encoder's and the decoder's side by side."""
    for variant, r in sorted(results.items(), key=lambda item: "k8" not in item[0]):
        tables = {name: record(experiment, variant, r["seeds"][0]).get(key)
                  for name, key in (("encoder", "relative_table"), ("decoder", "decoder_relative_table"))}
        tables = {name: table for name, table in tables.items() if table is not None}
        if not tables:
            continue
        fig, axes = plt.subplots(1, len(tables), figsize=(5 * len(tables), 3.5), squeeze=False)
        for ax, (name, table) in zip(axes[0], tables.items()):
            image = ax.imshow(table, cmap="RdBu", aspect="auto")
            ax.set_ylabel("bucket r (distance + k)")
            ax.set_xlabel("head dimension")
            fig.colorbar(image, ax=ax)
            ax.set_title(f"{experiment}/{variant}: E_K of layer 0" + (f" ({name})" if len(tables) > 1 else ""),
                         fontsize=10)
        save(f"{experiment}_relative_table.png", fig)
        return


def last_layer_attention(experiment, results, variant):
    """The last layer's attention weights [H, L, L] of a variant's first seed (the encoder's, for
    pairs) on its experiment's prompt, and the prompt."""
    attention = record(experiment, variant, results[variant]["seeds"][0])["attention"]
    return np.array(attention["last_layer"]), attention["prompt"]


def draw_attention(maps, labels, title, filename):
    """One row per variant, one column per head; labels name the tokens (None: no tick labels)."""
    heads = next(iter(maps.values())).shape[0]
    size = 2.2 if labels is None else 2.8
    fig, axes = plt.subplots(len(maps), heads, figsize=(size * heads, size * len(maps)), squeeze=False)
    for row, (variant, weights) in enumerate(maps.items()):
        for head in range(heads):
            ax = axes[row][head]
            ax.imshow(weights[head], cmap="viridis", vmin=0, vmax=1)
            ticks = [] if labels is None else range(len(labels))
            ax.set_xticks(ticks, [] if labels is None or row < len(maps) - 1 else labels, rotation=90, fontsize=6)
            ax.set_yticks(ticks, [] if labels is None or head > 0 else labels, fontsize=6)
            if head == 0:
                ax.set_ylabel(variant)
            if row == 0:
                ax.set_title(f"head {head}", fontsize=9)
    fig.suptitle(title, fontsize=9)
    save(filename, fig, dpi=110)


def length_attention(results):
    maps = {variant: last_layer_attention("length", results, variant)[0] for variant in results}
    draw_attention(maps, None, "length task: last layer's attention (query rows, key columns), A at 10, B at 13",
                   "length_attention.png")


def text_attention(experiment, results, variants, filename):
    variants = [v for v in variants if v in results]
    if variants:
        attention = {v: last_layer_attention(experiment, results, v) for v in variants}
        maps = {v: weights for v, (weights, _) in attention.items()}
        prompt = attention[variants[0]][1]
        draw_attention(maps, prompt.split(), f"{experiment}: last layer's attention (query rows, key columns), "
                       f"first seed", filename)


# --- 6. the relative family beside Kazemnejad et al. (2023) ---------------------------------------

FAMILY_TASKS = ("copy", "reverse", "addition", "sort")
# The tasks the ranking (MRR) is taken over: those the model fitted at its trained lengths. No
# scheme fitted addition (docs/results.md, section 6's calibration): every scheme scores 0 on its
# longer inputs, and a query of such scores would be ranked by the tie rule alone.
FAMILY_RANKED_TASKS = ("copy", "reverse", "sort")
SCHEME_NAMES = {"none": "NoPE", "sinusoidal": "sinusoidal (APE)", "learned": "learned", "rope": "RoPE",
                "alibi": "ALiBi", "t5": "T5 bias", "gated": "gated", "relative-k2": "Shaw k=2",
                "relative-k8": "Shaw k=8"}
SCHEME_COLORS = dict(zip(SCHEME_NAMES, plt.get_cmap("tab10").colors))
# The paper's five encodings in the order of its table: a tie within a query goes to the one listed
# first (pandas rank(method="first") in the authors' notebook), as in its Figure 1.
PAPER_ENCODINGS = ("rope", "alibi", "t5", "sinusoidal", "none")


@functools.cache
def paper():
    with open(os.path.join(DATA, "family", "paper.json")) as f:
        return json.load(f)


def seed_list(seeds):
    return ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(map(str, seeds))


def bucket_range(name):
    low, high = name.split("-")
    return int(low), int(high)


def longest_trained_source(sets):
    """The longest prompt a family run trained on, in tokens: the upper training length of the config
    or of the run's --sets, and for addition two operands of that many digits and '+'."""
    with open("configs/experiments/family.json") as f:
        task = json.load(f)["task"]
    values = dict(assignment.split("=", 1) for assignment in sets)
    longest = json.loads(values.get("task.train_lengths", json.dumps(task["train_lengths"])))[1]
    return 2 * longest + 1 if values.get("task.kind") == "addition" else longest


def split_metrics(run):
    """A run's exact match and token accuracy pooled over its in-distribution length buckets
    (prompts no longer than trained on) and over the longer ones: {"in": {...}, "out": {...}}."""
    longest = longest_trained_source(run["sets"])
    pooled = {}
    for split in ("in", "out"):
        buckets = [b for name, b in run["summary"]["final"]["by_length"].items()
                   if (bucket_range(name)[1] <= longest) == (split == "in")]
        examples = sum(b["examples"] for b in buckets)
        pooled[split] = {key: sum(b[key] * b["examples"] for b in buckets) / examples
                         for key in ("accuracy", "token_accuracy")}
    return pooled


def family_runs(results):
    """{task: {scheme: {seed: record}}} of the variants in results.json."""
    runs = {}
    for variant, r in results.items():
        task, scheme = variant.split("/")
        runs.setdefault(task, {})[scheme] = {seed: record("family", variant, seed) for seed in r["seeds"]}
    return {task: runs[task] for task in FAMILY_TASKS if task in runs}


def reciprocal_ranks(scores, schemes, ties):
    """One query: the schemes ranked by score, best = 1, as {scheme: 1 / rank}. ties = "first": a
    tie goes to the scheme listed first (the paper's rule); "average": tied schemes share the mean
    of their ranks."""
    ranked = sorted(schemes, key=lambda scheme: -scores[scheme])  # a stable sort: ties keep the order
    rank = {scheme: position + 1 for position, scheme in enumerate(ranked)}
    if ties == "average":
        rank = {s: np.mean([rank[t] for t in schemes if scores[t] == scores[s]]) for s in schemes}
    return {scheme: 1.0 / rank[scheme] for scheme in schemes}


def mean_reciprocal_rank(queries):
    """MRR: each scheme's reciprocal rank averaged over the queries (every task and seed counts once)."""
    return {scheme: float(np.mean([query[scheme] for query in queries])) for scheme in queries[0]}


def family_queries(runs, schemes, ties):
    """This machine's queries: one per task and seed that every scheme finished, scored by the
    out-of-distribution exact match (as the paper scores its test split)."""
    queries = []
    for task, by_scheme in runs.items():
        if not all(scheme in by_scheme for scheme in schemes):
            continue
        for seed in sorted(set.intersection(*[set(by_scheme[scheme]) for scheme in schemes])):
            scores = {scheme: split_metrics(by_scheme[scheme][seed])["out"]["accuracy"] for scheme in schemes}
            queries.append(reciprocal_ranks(scores, schemes, ties))
    return queries


def paper_queries(tasks):
    """The paper's queries on the same tasks, from its released per-seed test accuracies (sort:
    only its reciprocal ranks were released)."""
    queries = []
    for task in tasks:
        released = paper()["tasks"][task]
        for seed in paper()["setup"]["seeds"]:
            if "reciprocal_rank_per_seed" in released[PAPER_ENCODINGS[0]]:
                queries.append({e: released[e]["reciprocal_rank_per_seed"][str(seed)] for e in PAPER_ENCODINGS})
            else:
                scores = {e: released[e]["per_seed"][str(seed)]["out_of_distribution"] for e in PAPER_ENCODINGS}
                queries.append(reciprocal_ranks(scores, PAPER_ENCODINGS, "first"))
    return queries


def family_tables(runs):
    """Prints section 6's tables: per task and scheme, exact match in and out of distribution and
    token accuracy out of it (mean ± std over seeds) beside the paper's; then the MRR."""
    def cell(values):
        return f"{np.mean(values):.2f} ± {np.std(values, ddof=1):.2f}" if len(values) > 1 else f"{values[0]:.2f}"

    def paper_cell(task, scheme, split):
        entry = paper()["tasks"][task].get(scheme)
        key = {"in": "in_distribution", "out": "out_of_distribution"}[split]
        return "-" if entry is None or entry[key] is None else f"{entry[key]:.2f} ± {entry[key + '_std']:.2f}"

    for task, by_scheme in runs.items():
        seeds = sorted(set.union(*[set(s) for s in by_scheme.values()]))
        print(f"\n{task} ({seed_list(seeds)})\n")
        print("| positions | exact match, trained lengths | exact match, longer | token accuracy, longer "
              "| paper: trained lengths | paper: longer |")
        print("| --- | --- | --- | --- | --- | --- |")
        for scheme in SCHEME_NAMES:
            if scheme not in by_scheme:
                continue
            split = [split_metrics(run) for run in by_scheme[scheme].values()]
            print(f"| {SCHEME_NAMES[scheme]} | {cell([s['in']['accuracy'] for s in split])} "
                  f"| {cell([s['out']['accuracy'] for s in split])} "
                  f"| {cell([s['out']['token_accuracy'] for s in split])} "
                  f"| {paper_cell(task, scheme, 'in')} | {paper_cell(task, scheme, 'out')} |")


def family_mrr(runs):
    """family_mrr.png, the counterpart of the paper's Figure 1: the MRR of the paper's five encodings
    here and in the paper (its Figure 1 and its released runs of the same tasks), and of all nine
    schemes here; also printed. Over the tasks of FAMILY_RANKED_TASKS only."""
    runs = {task: by_scheme for task, by_scheme in runs.items() if task in FAMILY_RANKED_TASKS}
    tasks = [task for task in runs if all(e in runs[task] for e in PAPER_ENCODINGS)]
    here_five = family_queries(runs, PAPER_ENCODINGS, "first")
    here_nine = family_queries(runs, tuple(SCHEME_NAMES), "average")
    if not here_five:
        return
    bars = {f"paper, Figure 1 (17 tasks, {3 * 17} queries)": paper()["mrr"]["figure1"]["values"],
            f"paper, {', '.join(tasks)} ({3 * len(tasks)} queries)": mean_reciprocal_rank(paper_queries(tasks)),
            f"this machine, {', '.join(tasks)} ({len(here_five)} queries)": mean_reciprocal_rank(here_five)}
    order = sorted(PAPER_ENCODINGS, key=lambda e: -paper()["mrr"]["figure1"]["values"][e])  # the figure's order
    print("\n| MRR | " + " | ".join(SCHEME_NAMES[e] for e in order) + " |")
    print("| --- " * 6 + "|")
    for label, values in bars.items():
        print(f"| {label} | " + " | ".join(f"{values[e]:.3f}" for e in order) + " |")
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [5, 6]})
    for i, (label, values) in enumerate(bars.items()):
        left.bar(np.arange(5) + (i - 1) * 0.27, [values[e] for e in order], 0.27, label=label)
    left.set_xticks(range(5), [SCHEME_NAMES[e] for e in order])
    left.set_ylabel("mean reciprocal rank (higher is better)")
    left.set_title("the paper's five encodings (ties: the paper's rule)", fontsize=10)
    left.legend(fontsize=7)
    if here_nine:
        nine = mean_reciprocal_rank(here_nine)
        print(f"\nall nine schemes here ({len(here_nine)} queries, tied schemes share their mean rank): "
              + ", ".join(f"{SCHEME_NAMES[s]} {nine[s]:.3f}" for s in sorted(nine, key=lambda s: -nine[s])))
        ranked = sorted(nine, key=lambda s: -nine[s])
        right.bar(range(len(ranked)), [nine[s] for s in ranked], color=[SCHEME_COLORS[s] for s in ranked])
        right.set_xticks(range(len(ranked)), [SCHEME_NAMES[s] for s in ranked], rotation=30, fontsize=8)
        right.set_title(f"all nine schemes, this machine ({len(here_nine)} queries; ties share their mean rank)",
                        fontsize=10)
    save("family_mrr.png", fig)


def family_by_length(runs):
    """family_by_length.png: exact match and token accuracy per prompt length here (mean ± std over
    seeds), a column per task, the trained lengths left of the dashed line; a last row with the
    paper's exact match per length where it was released (copy and reverse)."""
    fig, axes = plt.subplots(3, len(runs), figsize=(4.2 * len(runs), 9.6), squeeze=False)
    for col, (task, by_scheme) in enumerate(runs.items()):
        for scheme, seeds in by_scheme.items():
            buckets = sorted(next(iter(seeds.values()))["summary"]["final"]["by_length"], key=bucket_range)
            for row, key in enumerate(("accuracy", "token_accuracy")):
                values = [[run["summary"]["final"]["by_length"][b][key] for run in seeds.values()] for b in buckets]
                means, stds = [np.mean(v) for v in values], [np.std(v, ddof=1) if len(v) > 1 else 0 for v in values]
                axes[row][col].errorbar(range(len(buckets)), means, yerr=error_bars(means, stds, "accuracy"),
                                        label=SCHEME_NAMES[scheme], color=SCHEME_COLORS[scheme], capsize=2,
                                        linewidth=1)
                axes[row][col].set_xticks(range(len(buckets)), buckets, fontsize=7)
            trained = sum(bucket_range(b)[1] <= longest_trained_source(next(iter(seeds.values()))["sets"])
                          for b in buckets)
            for row in (0, 1):
                axes[row][col].axvline(trained - 0.5, color="gray", linestyle="--", linewidth=0.8)
        axes[0][col].set_title(f"{task} ({seed_list(sorted(next(iter(by_scheme.values()))))})")
        axes[1][col].set_xlabel("prompt length (tokens)")
        released = paper()["tasks"][task]
        if released["none"].get("by_length"):
            for e in PAPER_ENCODINGS:
                lengths = sorted(released[e]["by_length"], key=int)
                axes[2][col].plot([int(n) for n in lengths], [released[e]["by_length"][n] for n in lengths],
                                  label=SCHEME_NAMES[e], color=SCHEME_COLORS[e], linewidth=1)
            axes[2][col].axvline(20.5, color="gray", linestyle="--", linewidth=0.8)
            axes[2][col].set_xlabel("input length (the paper's runs, mean over 3 seeds)")
        else:
            axes[2][col].text(0.5, 0.5, "no per-length numbers released", ha="center", va="center",
                              transform=axes[2][col].transAxes)
            axes[2][col].set_xticks([])
        for row in range(3):
            axes[row][col].set_ylim(-0.03, 1.03)
    axes[0][0].set_ylabel("exact match")
    axes[1][0].set_ylabel("token accuracy")
    axes[2][0].set_ylabel("exact match, paper")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle("the relative family by length: this machine (rows 1-2) and Kazemnejad et al. 2023 (row 3)",
                 fontsize=10)
    save("family_by_length.png", fig, dpi=110)


def main():
    os.makedirs(OUT, exist_ok=True)
    all_results = {}
    for experiment in ("length", "sentiment", "translation"):
        results = load(experiment)
        if results is None:
            continue
        all_results[experiment] = results
        loss_curves(experiment, results)
        by_length(experiment, results)
        relative_table(experiment, results)
        if experiment == "translation":
            bleu_over_training(experiment, results)
            bleu_vs_k(results)
            text_attention(experiment, results, ["sinusoidal", "relative-k0", "relative-k2", "relative-k8"],
                           "translation_attention.png")
        if experiment == "sentiment":
            text_attention(experiment, results, ["yelp/sinusoidal", "yelp/relative-k8", "yelp/gated"],
                           "sentiment_attention.png")
        if experiment == "length":
            length_attention(results)
    gates(all_results)
    if load("gates"):
        gates_over_training(load("gates"))
    if load("sequence"):
        sequence_by_length(load("sequence"))
    if load("family"):
        family = family_runs(load("family"))
        family_tables(family)
        family_mrr(family)
        family_by_length(family)
    print("plots in", OUT)


if __name__ == "__main__":
    main()
