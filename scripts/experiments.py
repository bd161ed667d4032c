#!/usr/bin/env python3
"""Runs the position-encoding experiments of docs/results.md and tabulates them.

    python3 scripts/experiments.py length sentiment translation [--seeds 1 2 3] [--jobs 2] [--relgrad build/relgrad]

Each run is `relgrad train CONFIG --set ... --set training.seed=S --out runs/experiments/EXP/VARIANT/seedS`
(printed before it starts), --jobs of them at a time; one with a checkpoint is resumed, so an
interrupted run continues where it stopped. A finished run leaves its record in
docs/results/data/EXP/VARIANT/seedS.json: its summary, its metrics.jsonl, its steps per second,
and, from its checkpoint, the relative key table of layer 0 and the last layer's attention on the
experiment's prompt. The records are kept with the documentation (runs/ holds the checkpoints and
is not), so a sweep can span machines; a run with a record is not run again. Afterwards
docs/results/data/EXP/results.json holds mean and spread over the seeds (variants not run this
time keep their entries), and a markdown table is printed (--finished-only: of the variants
finished so far, training nothing). scripts/plot_results.py draws the plots from the records.

On a cluster, --list numbers the sweep's runs and --only N runs the N-th alone, one per task of a
job array (docs/distributed.md shows Slurm's); --finished-only tabulates them afterwards.
"""
import argparse
import concurrent.futures
import fcntl
import glob
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

import numpy as np

SOURCES = ["imdb", "yelp", "amazon"]
NO_DECAY = [{"match": "*bias", "weight_decay": 0}, {"match": "*norm*", "weight_decay": 0}]  # the defaults' rest
# The prompts whose last-layer attention a run's record keeps, written as the experiment's tokenizer
# splits them (sentiment: words between spaces; translation: lowercase, punctuation as words of its
# own; the length task: symbol ids, marker A = 4 three positions before B = 5, a positive example).
SENTIMENT_PROMPT = "the food was not good but the service was really great"
TRANSLATION_PROMPT = "ich habe heute keine zeit , weil ich arbeiten muss ."
LENGTH_PROMPT = " ".join("4" if i == 10 else "5" if i == 13 else str(6 + i % 10) for i in range(32))
# the paper's lengths: copy and reverse train on 2-20 and test on 21-40 (the config's), addition and
# sort train on 1-8 and test on 9-16 (addition: digits per operand, so its buckets count the
# prompt's 2n + 1 tokens)
FAMILY_SHORT = ["task.train_lengths=[1,8]", "task.test_lengths=[1,16]"]
FAMILY_TASK_SETS = {"addition": FAMILY_SHORT + ["evaluation.length_buckets=[9,17,25,33]"],
                    "sort": FAMILY_SHORT + ["evaluation.length_buckets=[4,8,12,16]"]}
EXPERIMENTS = {
    # 1. sentiment: sinusoidal vs relative k=8 vs relative k=16 vs gated, per source
    "sentiment": {
        "config": "configs/experiments/sentiment.json",
        "attention_prompt": SENTIMENT_PROMPT,
        "variants": {
            f"{source}/{name}": [f"data.train=data:sentiment/{source}.tsv"] + sets
            for source in SOURCES
            for name, sets in [("sinusoidal", ["model.position=sinusoidal"]), ("relative-k8", ["model.k=8"]),
                               ("relative-k16", ["model.k=16"]), ("gated", ["model.position=gated"])]
        },
    },
    # 2. German -> English, Shaw et al.'s Table 3: k in 0..16 with and without the value-side term
    # (k = 0: one bucket for every distance, no position information), and sinusoidal
    "translation": {
        "config": "configs/experiments/translation.json",
        "attention_prompt": TRANSLATION_PROMPT,
        "variants": dict([("sinusoidal", ["model.position=sinusoidal"])] +
                         [(f"relative-k{k}{suffix}", [f"model.k={k}"] + sets)
                          for suffix, sets in (("", []), ("-keys", ["model.relative_values=false"]))
                          for k in (0, 1, 2, 4, 8, 16)]),
    },
    # 4. what the gates choose: gated models on a task of relative order and on one of absolute
    # position, with the gates' own learning rate 1, 5 and 25 times the others'; and at 25 with
    # relative tables that start at the absolute term's scale (std 0.5 instead of 0.02)
    "gates": {
        "config": "configs/experiments/length.json",
        "variants": {
            f"{task}/gate-lr{scale}{suffix}": [
                "model.position=gated", f"task.kind={task}", "evaluation.every=50", "task.test_examples=500",
                "optimizer.groups=" + json.dumps([{"match": "*gate*", "lr_scale": scale, "weight_decay": 0}] + NO_DECAY)
            ] + sets
            for task in ("relative_order", "symbol_at")
            for scale, suffix, sets in [(1, "", []), (5, "", []), (25, "", []),
                                        (25, "-wide-tables", ["model.relative_init_std=0.5"])]
        },
    },
    # 3b. length generalization on sequence tasks: trained on lengths 4-16, tested on 4-64
    "sequence": {
        "config": "configs/experiments/sequence.json",
        "variants": {
            f"{task}/{name}": [f"task.kind={task}"] + sets
            for task in ("copy", "reverse", "dedupe")
            for name, sets in [(p, [f"model.position={p}"]) for p in ("none", "sinusoidal", "learned")] +
            [(f"relative-k{k}", ["model.position=relative", f"model.k={k}"]) for k in (2, 4, 8, 16)] +
            [("gated", ["model.position=gated"])]
        },
    },
    # 5. mixed precision (docs/precision.md): the quickstart, and sentiment on IMDB, in each
    # training.precision
    "precision": {
        "config": "configs/quickstart.json",
        "variants": {p: [f"training.precision={p}"] for p in ("float32", "bfloat16", "float16")},
    },
    "precision-sentiment": {
        "config": "configs/experiments/sentiment.json",
        "variants": {p: ["data.train=data:sentiment/imdb.tsv", f"training.precision={p}"]
                     for p in ("float32", "bfloat16", "float16")},
    },
    # 3. length generalization: train on lengths 8-24, test up to 64
    "length": {
        "config": "configs/experiments/length.json",
        "attention_prompt": LENGTH_PROMPT,
        "variants": {name: [f"model.position={name}"] for name in ("sinusoidal", "learned", "relative", "gated")},
    },
    # 6. the relative family beside Shaw (docs/results.md): decoder-only models, every scheme on four
    # tasks, trained on short lengths and tested on longer ones as Kazemnejad et al. (2023) do
    # (docs/results/data/family/paper.json holds their released numbers)
    "family": {
        "config": "configs/experiments/family.json",
        "variants": {
            f"{task}/{name}": [f"task.kind={task}"] + FAMILY_TASK_SETS.get(task, []) + sets
            for task in ("copy", "reverse", "addition", "sort")
            for name, sets in [(p, [f"model.position={p}"])
                               for p in ("none", "sinusoidal", "learned", "rope", "alibi", "t5", "gated")] +
            [(f"relative-k{k}", ["model.position=relative", f"model.k={k}"]) for k in (2, 8)]
        },
    },
}


DATA = os.path.join("docs", "results", "data")


def run_dir(experiment, variant, seed):
    return os.path.join("runs", "experiments", experiment, variant, f"seed{seed}")


def record_path(experiment, variant, seed):
    return os.path.join(DATA, experiment, variant, f"seed{seed}.json")


def train(relgrad, experiment, variant, sets, seed):
    """Trains one run unless it has a record (resuming it from its checkpoint if it has one), then
    writes its record."""
    if has_record(relgrad, experiment, variant, sets, seed):
        return
    out = run_dir(experiment, variant, seed)
    command = [relgrad, "train", EXPERIMENTS[experiment]["config"]]
    for assignment in sets + [f"training.seed={seed}"]:
        command += ["--set", assignment]
    command += ["--out", out]
    print("+", shlex.join(command), flush=True)
    if any(os.path.exists(os.path.join(out, name)) for name in ("checkpoint", "checkpoint.previous")):
        command.append("--resume")
    result = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        sys.exit(f"{experiment}/{variant} seed {seed} failed: {result.stderr.strip()}")
    write_record(relgrad, experiment, variant, sets, seed)
    print(f"done: {out}", flush=True)


def has_record(relgrad, experiment, variant, sets, seed):
    """Whether the run has a record, writing it first for a run that finished in runs/ without one."""
    if os.path.exists(record_path(experiment, variant, seed)):
        return True
    if not os.path.exists(os.path.join(run_dir(experiment, variant, seed), "summary.json")):
        return False
    write_record(relgrad, experiment, variant, sets, seed)
    return True


def write_record(relgrad, experiment, variant, sets, seed):
    """docs/results/data/EXP/VARIANT/seedS.json from a finished run in runs/."""
    out = run_dir(experiment, variant, seed)
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    if any(summary["metric"] not in bucket for bucket in summary["final"]["by_length"].values()):
        summary["final"] = evaluation(relgrad, out)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        metrics = [json.loads(line) for line in f]
    record = {"experiment": experiment, "variant": variant, "seed": seed, "sets": sets, "summary": summary,
              "steps_per_second": steps_per_second(metrics), "metrics": metrics}
    record.update(relative_tables(out))
    prompt = EXPERIMENTS[experiment].get("attention_prompt")
    if prompt is not None:
        record["attention"] = {"prompt": prompt, "last_layer": last_layer_attention(relgrad, out, prompt)}
    path = record_path(experiment, variant, seed)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(record, f, separators=(",", ":"))
        f.write("\n")


def evaluation(relgrad, run_dir):
    """The test metrics of a run made before every metric was also reported per length bucket
    (sequence pairs: exact match only), from `relgrad eval`."""
    print("+", relgrad, "eval", run_dir, flush=True)
    result = subprocess.run([relgrad, "eval", run_dir], capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"relgrad eval {run_dir} failed: {result.stderr.strip()}")
    return json.loads(result.stdout)


def relative_tables(run_dir):
    """The relative key tables E_K of layer 0 [2k + 1, head dim] from the run's checkpoint, rounded
    to 5 digits: "relative_table" (the encoder's, or the one stack's) and, for pairs,
    "decoder_relative_table" (causal: only its rows of distances <= 0 are ever used); none for a
    model without relative positions."""
    tables = {}
    for path in glob.glob(os.path.join(run_dir, "checkpoint", "model",
                                       "*layers.0.self_attention.rel_pos_emb_k.weight.npy")):
        key = "decoder_relative_table" if os.path.basename(path).startswith("decoder") else "relative_table"
        tables[key] = np.round(np.load(path).astype(np.float64), 5).tolist()
    return tables


def last_layer_attention(relgrad, run_dir, prompt):
    """The last layer's attention weights [H, L, L] (the encoder's, for pairs) on one prompt, from
    `relgrad attention`, rounded to 4 digits."""
    with tempfile.TemporaryDirectory() as work:
        result = subprocess.run([relgrad, "attention", run_dir, "--prompt", prompt, "--out", work],
                                capture_output=True, text=True)
        if result.returncode != 0:
            sys.exit(f"relgrad attention {run_dir} failed: {result.stderr.strip()}")
        last = len(glob.glob(os.path.join(work, "layer*.npy"))) - 1
        return np.round(np.load(os.path.join(work, f"layer{last}.npy")).astype(np.float64), 4).tolist()


def steps_per_second(metrics):
    """The median step rate over the logged stretches of a run (robust to an evaluation or a pause
    in one stretch); None for runs logged without `seconds`."""
    rates, previous = [], None
    for entry in metrics:
        if "seconds" not in entry:
            continue
        if previous and entry["seconds"] > previous["seconds"]:  # the same invocation
            rates.append((entry["step"] - previous["step"]) / (entry["seconds"] - previous["seconds"]))
        previous = entry
    return statistics.median(rates) if rates else None


def load_record(experiment, variant, seed):
    with open(record_path(experiment, variant, seed)) as f:
        record = json.load(f)
    return dict(record["summary"], steps_per_second=record["steps_per_second"])


def spread(values):
    return {"mean": statistics.mean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "values": values}


def aggregate(summaries):
    first = summaries[0]
    metric = first["metric"]
    result = {"metric": metric, metric: spread([s["final"][metric] for s in summaries])}
    for key, value in first["final"].items():  # the task's other numbers (token_accuracy, bits_per_char, ...)
        if key != metric and isinstance(value, (int, float)) and all(key in s["final"] for s in summaries):
            result[key] = spread([s["final"][key] for s in summaries])
    for key in ("train_seconds", "tokens_per_second", "peak_rss_mib", "peak_live_mib", "steps_per_second"):
        if all(s.get(key) is not None for s in summaries):
            result[key] = spread([s[key] for s in summaries])
    inner = metric if metric in next(iter(first["final"]["by_length"].values())) else "accuracy"
    result["by_length"] = {bucket: spread([s["final"]["by_length"][bucket][inner] for s in summaries
                                           if bucket in s["final"]["by_length"]])
                           for bucket in first["final"]["by_length"]}
    # every number of every bucket (sequence tasks: exact match, token accuracy, BLEU)
    result["by_length_metrics"] = {
        bucket: {key: spread([s["final"]["by_length"][bucket][key] for s in summaries])
                 for key, value in values.items() if isinstance(value, (int, float))}
        for bucket, values in first["final"]["by_length"].items()
        if all(bucket in s["final"]["by_length"] for s in summaries)}
    if "gates" in first:
        result["gates"] = [s["gates"] for s in summaries]
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiments", nargs="+", choices=sorted(EXPERIMENTS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--relgrad", default="build/relgrad")
    parser.add_argument("--variants", nargs="+", help="run only these variants (default: all)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="runs at a time (give each one thread: training.threads in the config)")
    parser.add_argument("--finished-only", action="store_true",
                        help="train nothing: tabulate the variants whose runs of every seed have finished "
                             "(a sweep that takes more than one sitting; a finished run in runs/ without its "
                             "record gets one) and name the others")
    parser.add_argument("--list", action="store_true",
                        help="print the sweep's runs, one a line, numbered from 0, and run nothing")
    parser.add_argument("--only", type=int, metavar="N",
                        help="run only the sweep's run N (as --list numbers them) and write its record: one run "
                             "per task of a cluster's job array; tabulate with --finished-only afterwards")
    args = parser.parse_args()
    sweep = [(experiment, variant, sets, seed) for experiment in args.experiments
             for variant, sets in EXPERIMENTS[experiment]["variants"].items()
             if not args.variants or variant in args.variants for seed in args.seeds]
    if args.list:
        for number, (experiment, variant, _, seed) in enumerate(sweep):
            print(f"{number} {experiment} {variant} seed {seed}")
        return
    if args.only is not None:
        if not 0 <= args.only < len(sweep):
            print(f"experiments.py: --only {args.only}: the sweep has {len(sweep)} runs, 0 to {len(sweep) - 1} "
                  "(see --list)", file=sys.stderr)
            sys.exit(2)
        train(args.relgrad, *sweep[args.only])
        return
    for experiment in args.experiments:
        variants = {variant: sets for variant, sets in EXPERIMENTS[experiment]["variants"].items()
                    if not args.variants or variant in args.variants}
        if args.finished_only:
            unfinished = [variant for variant, sets in variants.items() if not all(
                [has_record(args.relgrad, experiment, variant, sets, seed) for seed in args.seeds])]
            if unfinished:
                print(f"{experiment}: not finished for seeds {args.seeds}: {', '.join(unfinished)}")
            variants = {variant: sets for variant, sets in variants.items() if variant not in unfinished}
            if not variants:
                continue
        else:
            with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
                for done in [pool.submit(train, args.relgrad, experiment, variant, sets, seed)
                             for variant, sets in variants.items() for seed in args.seeds]:
                    done.result()
        results = {}
        for variant, sets in variants.items():
            results[variant] = aggregate([load_record(experiment, variant, seed) for seed in args.seeds])
            results[variant]["seeds"] = args.seeds
            results[variant]["sets"] = sets
        # The variants not tabulated this time (--variants, --finished-only) keep their entries: a
        # sweep may be run in parts. Each entry names its seeds. Parts run at the same time take
        # turns (a lock on the experiment's folder), and the file is replaced whole.
        path = os.path.join(DATA, experiment, "results.json")
        folder = os.open(os.path.dirname(path), os.O_RDONLY)
        try:
            fcntl.flock(folder, fcntl.LOCK_EX)
            kept = {}
            if os.path.exists(path):
                with open(path) as f:
                    kept = json.load(f)
            merged = {variant: results[variant] if variant in results else kept[variant]
                      for variant in EXPERIMENTS[experiment]["variants"] if variant in results or variant in kept}
            with open(path + ".new", "w") as f:
                json.dump(merged, f, indent=1)
            os.replace(path + ".new", path)
        finally:
            os.close(folder)  # releases the lock
        metric = next(iter(results.values()))["metric"]
        others = [key for key in ("accuracy", "token_accuracy") if key != metric and key in next(iter(results.values()))]
        print(f"\n{experiment}: mean ± std over seeds {args.seeds}\n")
        print(f"| variant | {' | '.join([metric] + others)} | seconds | steps/s | peak live MiB | peak RSS MiB |")
        print("| --- " * (6 + len(others)) + "|")
        for variant, r in results.items():
            numbers = " | ".join(f"{r[key]['mean']:.4f} ± {r[key]['std']:.4f}" for key in [metric] + others)
            cost = [f"{r[key]['mean']:{form}}" if key in r else "-"
                    for key, form in (("train_seconds", ".0f"), ("steps_per_second", ".2f"),
                                      ("peak_live_mib", ".0f"), ("peak_rss_mib", ".0f"))]
            print(f"| {variant} | {numbers} | {' | '.join(cost)} |")
        print(f"\nwritten: {path}")


if __name__ == "__main__":
    main()
