"""One writer per run directory, and readers that never fall between two checkpoints:

- a run whose lock another process holds is refused (exit 2, one line naming the directory and
  the holder's pid), its files untouched: a fresh run, and --resume;
- two `relgrad train` started at once in one directory, fresh or both --resume: one trains to the
  end, with the metrics of a run trained alone, and the other is refused;
- `relgrad eval` called again and again on a run while it trains (a checkpoint every step) loads
  every time: the old checkpoint or the new one, never neither.

    /usr/bin/python3 tests/cli/test_one_writer.py --relgrad build/relgrad
"""
import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_kill_resume import without_timing  # noqa: E402  a record without its timing fields

CONFIG = {
    "model": {"layers": 1, "dim": 16, "heads": 2, "ff_dim": 32, "k": 4},
    "task": {"kind": "relative_order", "train_examples": 200, "test_examples": 32,
             "train_lengths": [6, 12], "test_lengths": [6, 16]},
    "training": {"steps": 60, "batch_size": 16, "learning_rate": 3e-3, "log_every": 1, "threads": 1},
    "evaluation": {"every": 20, "length_buckets": [8, 16]},
    "output": {"checkpoint_every": 1},
}


def fail(message):
    sys.exit(f"FAIL: {message}")


def metrics(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [without_timing(json.loads(line)) for line in f]


def snapshot(run):
    """Every file of the run directory but the lock, as bytes."""
    files = {}
    for root, _, names in os.walk(run):
        for name in names:
            path = os.path.join(root, name)
            if name != "lock":
                with open(path, "rb") as f:
                    files[os.path.relpath(path, run)] = f.read()
    return files


def train(relgrad, config_path, run, *extra):
    return subprocess.Popen([relgrad, "train", config_path, "--out", run, *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def expect_refused(process, run, pid=None):
    _, stderr = process.communicate()
    lines = stderr.strip().splitlines()
    wanted = f"{run}: another relgrad process{f' (pid {pid})' if pid else ''} is training this run"
    if process.returncode != 2 or len(lines) != 1 or wanted not in lines[0]:
        fail(f"expected exit 2 and one line with '{wanted}', got {process.returncode}: {stderr!r}")


def held_lock(relgrad, config_path, work, alone):
    """A run whose lock is held (as a training process holds it) is refused, and nothing changes."""
    for resume in (False, True):
        run = os.path.join(work, f"held_{'resume' if resume else 'fresh'}")
        if resume:
            shutil.copytree(alone, run)
            os.remove(os.path.join(run, "summary.json"))  # a stopped run, resumable
        else:
            os.makedirs(run)
        before = snapshot(run)
        with open(os.path.join(run, "lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            lock.write("4242\n")
            lock.flush()
            expect_refused(train(relgrad, config_path, run, *(["--resume"] if resume else [])), run, pid=4242)
        if snapshot(run) != before:
            fail(f"{'--resume' if resume else 'a fresh run'} refused, yet the run directory changed")
    print("a held lock: a fresh run and --resume refused, naming the pid; nothing written")


def two_at_once(relgrad, config_path, work, alone):
    """Two writers started together: exactly one trains, to the same metrics as a run alone."""
    expected = metrics(alone)
    stopped = os.path.join(work, "stopped")
    subprocess.run([relgrad, "train", config_path, "--out", stopped, "--stop-after", "20"], check=True,
                   stdout=subprocess.DEVNULL)
    cases = [("fresh", None, [[], []]), ("fresh, another seed", None, [[], ["--set", "training.seed=7"]]),
             ("--resume", stopped, [["--resume"], ["--resume"]])]
    for name, start_from, extras in cases:
        run = os.path.join(work, "race_" + name.replace(" ", "_").replace(",", ""))
        if start_from:
            shutil.copytree(start_from, run)
        processes = [train(relgrad, config_path, run, *extra) for extra in extras]
        results = [(p, *p.communicate()) for p in processes]
        winners = [p for p, _, _ in results if p.returncode == 0]
        if len(winners) != 1:
            fail(f"{name}: {len(winners)} of two writers exited 0: {[(p.returncode, e) for p, _, e in results]}")
        loser = next(p for p in processes if p is not winners[0])
        lines = [e for p, _, e in results if p is loser][0].strip().splitlines()
        wanted = f"{run}: another relgrad process (pid {winners[0].pid}) is training this run"
        if loser.returncode != 2 or len(lines) != 1 or wanted not in lines[0]:
            fail(f"{name}: the second writer: exit {loser.returncode}, {lines}, expected '{wanted}'")
        got = metrics(run)
        if winners[0] is processes[0] or name != "fresh, another seed":
            if got != expected:
                fail(f"{name}: metrics.jsonl has {len(got)} lines, unlike the {len(expected)} of a run alone")
        elif len(got) != len(expected):  # the other seed won: its own numbers, as many lines
            fail(f"{name}: metrics.jsonl has {len(got)} lines, expected {len(expected)}")
    print("two writers at once (fresh, another seed, --resume): one trained, the other refused")


def readers_while_training(relgrad, config_path, work):
    """relgrad eval on a run that writes a checkpoint every step: every call after the first loads."""
    run = os.path.join(work, "read_while_training")
    writer = train(relgrad, config_path, run, "--set", "training.steps=1000")  # a few seconds
    calls = failures = 0
    first_failure = ""
    while writer.poll() is None:
        if not os.path.exists(os.path.join(run, "checkpoint")):
            continue
        reader = subprocess.run([relgrad, "eval", run], capture_output=True, text=True)
        calls += 1
        if reader.returncode != 0:
            failures += 1
            first_failure = first_failure or reader.stderr.strip()
    _, stderr = writer.communicate()
    if writer.returncode != 0:
        fail(f"the run read while training failed: {stderr}")
    if failures:
        fail(f"{failures} of {calls} evals failed while the run trained, the first: {first_failure}")
    if calls < 10:
        fail(f"only {calls} evals ran while the run trained: the test proved little")
    print(f"{calls} evals while the run trained, a checkpoint every step: every one loaded")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--relgrad", required=True)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="relgrad_one_writer_")
    try:
        config_path = os.path.join(work, "config.json")
        with open(config_path, "w") as f:
            json.dump(CONFIG, f)
        alone = os.path.join(work, "alone")
        subprocess.run([args.relgrad, "train", config_path, "--out", alone], check=True, stdout=subprocess.DEVNULL)
        held_lock(args.relgrad, config_path, work, alone)
        two_at_once(args.relgrad, config_path, work, alone)
        readers_while_training(args.relgrad, config_path, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
