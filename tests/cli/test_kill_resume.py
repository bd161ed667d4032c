"""A training run killed with SIGKILL at many moments, inside checkpoint writes too, and resumed
each time, ends exactly where an uninterrupted run ends: the same checkpoint bytes, the same
metrics.jsonl and summary.json (their timing fields aside). So does a run interrupted with
Ctrl-C (SIGINT) and then SIGTERM, each of which ends it after the current step with that step's
checkpoint written.

    /usr/bin/python3 tests/cli/test_kill_resume.py --relgrad build/relgrad
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

CONFIG = {
    "model": {"layers": 1, "dim": 16, "heads": 2, "ff_dim": 32, "k": 4},
    "task": {"kind": "relative_order", "train_examples": 300, "test_examples": 48,
             "train_lengths": [6, 12], "test_lengths": [6, 16]},
    # one thread: the other core polls the run directory
    "training": {"steps": 150, "batch_size": 16, "learning_rate": 3e-3, "log_every": 1, "threads": 1},
    "evaluation": {"every": 10, "length_buckets": [8, 16]},
    "output": {"checkpoint_every": 2},  # most of the run's time is spent writing checkpoints
}
TIMING_KEYS = {"seconds", "tokens_per_second", "train_seconds", "peak_rss_mib", "peak_live_mib"}


def without_timing(entry):
    return {key: value for key, value in entry.items() if key not in TIMING_KEYS}


def run_files(run):
    """What two runs of the same config must share exactly."""
    with open(os.path.join(run, "metrics.jsonl")) as f:
        metrics = [without_timing(json.loads(line)) for line in f]
    with open(os.path.join(run, "summary.json")) as f:
        summary = without_timing(json.load(f))
    checkpoint = {}
    for root, _, files in os.walk(os.path.join(run, "checkpoint")):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                checkpoint[os.path.relpath(path, run)] = f.read()
    return metrics, summary, checkpoint


def start(relgrad, config_path, run, overrides=()):
    has_checkpoint = any(os.path.exists(os.path.join(run, name, "state.json"))
                         for name in ("checkpoint", "checkpoint.previous"))
    command = [relgrad, "train", config_path, "--out", run] + (["--resume"] if has_checkpoint else [])
    for assignment in overrides:
        command += ["--set", assignment]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def wait_for(process, condition, timeout=60.0):
    """Polls until condition() holds (True) or the process ends (False)."""
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        if condition():
            return True
    return False


def interrupt_and_resume(relgrad, config_path, run):
    """Interrupts a run with SIGINT, resumes it, interrupts it with SIGTERM, resumes it to its end."""
    # no checkpoint before the last step but those the interrupts write
    overrides = ["output.checkpoint_every=1000"]
    stopped_at = 0
    for interrupt in (signal.SIGINT, signal.SIGTERM):
        process = start(relgrad, config_path, run, overrides)
        started = stopped_at
        # a step logged after this invocation began: the run is training
        if not wait_for(process, lambda: last_step(run) > started):
            sys.exit(f"the run ended before it could be sent {interrupt.name}")
        process.send_signal(interrupt)
        _, stderr = process.communicate()
        if process.returncode != 128 + interrupt:
            sys.exit(f"{interrupt.name}: exit code {process.returncode}, not {128 + interrupt}: {stderr.decode()}")
        with open(os.path.join(run, "checkpoint", "state.json")) as f:
            stopped_at = json.load(f)["step"]
        if f"interrupted after step {stopped_at}, checkpoint written" not in stderr.decode():
            sys.exit(f"{interrupt.name}: stderr does not name the checkpoint's step {stopped_at}: {stderr.decode()}")
        if stopped_at <= started or os.path.exists(os.path.join(run, "summary.json")):
            sys.exit(f"{interrupt.name}: the run did not stop early (checkpoint at step {stopped_at})")
        print(f"{interrupt.name}: stopped after step {stopped_at} with its checkpoint", flush=True)
    process = start(relgrad, config_path, run, overrides)
    _, stderr = process.communicate()
    if process.returncode != 0:
        sys.exit(f"the run resumed after the interrupts failed ({process.returncode}): {stderr.decode()}")


def last_step(run):
    try:
        with open(os.path.join(run, "metrics.jsonl")) as f:
            return max((json.loads(line)["step"] for line in f if line.endswith("\n")), default=0)
    except FileNotFoundError:
        return 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--relgrad", required=True)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="relgrad_kill_resume_")
    try:
        config_path = os.path.join(work, "config.json")
        with open(config_path, "w") as f:
            json.dump(CONFIG, f)
        whole, parts = os.path.join(work, "whole"), os.path.join(work, "parts")
        subprocess.run([args.relgrad, "train", config_path, "--out", whole], check=True,
                       stdout=subprocess.DEVNULL)

        partial = os.path.join(parts, "checkpoint.partial")
        previous = os.path.join(parts, "checkpoint.previous")
        rng = random.Random(7)
        # the moments to kill at, in turn: a checkpoint being written, a checkpoint being swapped
        # in, and a random moment
        moments = [("during a checkpoint write", lambda: os.path.isdir(partial)),
                   ("between the checkpoint's renames", lambda: os.path.isdir(previous)),
                   ("at a random moment", None)]
        summary = os.path.join(parts, "summary.json")
        kills, inside_writes = 0, 0
        # summary.json is the run's last write, and atomic: once it exists the run is finished
        # (a kill can land after it, and a resume would then rightly be refused)
        while not os.path.exists(summary):
            name, condition = moments[kills % len(moments)]
            process = start(args.relgrad, config_path, parts)
            if condition is None:
                time.sleep(rng.uniform(0.05, 0.6))
                hit = process.poll() is None
            else:
                hit = wait_for(process, condition)
            if hit and kills < 12:
                process.send_signal(signal.SIGKILL)
                process.wait()
                kills += 1
                if os.path.isdir(partial) or os.path.isdir(previous):
                    inside_writes += 1
                print(f"killed {name}", flush=True)
                continue
            _, stderr = process.communicate()
            if process.returncode != 0:
                sys.exit(f"the resumed run failed ({process.returncode}): {stderr.decode()}")

        if kills < 6 or inside_writes < 2:
            sys.exit(f"only {kills} kills, {inside_writes} of them inside a checkpoint write: the test proved little")
        expected, got = run_files(whole), run_files(parts)
        for what, a, b in zip(("metrics.jsonl", "summary.json", "checkpoint"), expected, got):
            if a != b:
                sys.exit(f"{what} differs from the uninterrupted run's after {kills} kills")
        print(f"{kills} kills ({inside_writes} inside a checkpoint write or swap): "
              f"the same checkpoint ({len(got[2])} files), metrics and summary")

        interrupted = os.path.join(work, "interrupted")
        interrupt_and_resume(args.relgrad, config_path, interrupted)
        if run_files(interrupted) != expected:
            sys.exit("after SIGINT and SIGTERM and resuming, the run differs from the uninterrupted one")
        print("interrupted twice and resumed: the same checkpoint, metrics and summary")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
