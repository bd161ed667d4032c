"""Training on several processes (mpirun, docs/distributed.md) gives the bits of one process.

With training.shards = 4, one process, mpirun -np 2 and mpirun -np 4 (shards left out: one per
process) write the same checkpoint bytes, metrics.jsonl and summary.json (their timing fields
aside), with dropout and relative positions; a run stopped on 2 processes and resumed on 1, or
the reverse, ends as the uninterrupted run; a killed process ends the whole job; a shard count the
processes cannot share, shards larger than the batch, and processes that disagree (config, data
file contents, program, device) are refused. The quickstart too gives the same bits on 1, 2 and 4.
With --emulated (the test build's relgrad on an emulated cuda device), the same bits on 1 and 2
processes with the model on the device, its gradients going through host memory.

    /usr/bin/python3 tests/cli/test_distributed.py --relgrad build/relgrad --mpirun /usr/bin/mpirun \
        [--emulated build/tests/relgrad_emulated]
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_kill_resume import run_files  # noqa: E402  what two runs of one config must share exactly

CONFIG = {
    "model": {"layers": 1, "dim": 16, "heads": 2, "ff_dim": 32, "k": 4, "dropout": 0.1, "position": "relative"},
    "task": {"kind": "relative_order", "train_examples": 300, "test_examples": 48,
             "train_lengths": [6, 12], "test_lengths": [6, 16]},
    "training": {"steps": 24, "batch_size": 16, "learning_rate": 3e-3, "log_every": 1, "threads": 1},
    "evaluation": {"every": 8, "length_buckets": [8, 16]},
    "output": {"checkpoint_every": 4},
}
# Open MPI refuses to run as root without these; --oversubscribe lets 4 processes share 2 cores
ENVIRONMENT = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


class Runs:
    def __init__(self, relgrad, mpirun, work):
        self.relgrad, self.mpirun, self.work = relgrad, mpirun, work
        self.config = os.path.join(work, "config.json")
        with open(self.config, "w") as f:
            json.dump(CONFIG, f)

    def command(self, processes, run, *arguments, config=None):
        train = [self.relgrad, "train", config or self.config, "--out", os.path.join(self.work, run), *arguments]
        if processes == 1:
            return train
        return [self.mpirun, "--oversubscribe", "-np", str(processes), *train]

    def train(self, processes, run, *arguments, expect=0, config=None):
        command = self.command(processes, run, *arguments, config=config)
        done = subprocess.run(command, env=ENVIRONMENT, capture_output=True, text=True, timeout=300)
        if done.returncode != expect:
            sys.exit(f"{' '.join(command)}: exit {done.returncode}, expected {expect}\n{done.stderr}")
        return done

    def files(self, run):
        return run_files(os.path.join(self.work, run))


def check(condition, what):
    if not condition:
        sys.exit("FAILED: " + what)
    print("ok:", what)


def children_of(pid):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    found.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--relgrad", required=True)
    parser.add_argument("--mpirun", required=True)
    parser.add_argument("--emulated", help="the relgrad program with an emulated cuda device")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        runs = Runs(args.relgrad, args.mpirun, work)
        # the quickstart (40 of its steps) on 1, 2 and 4 processes
        quickstart = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "quickstart.json")
        for processes in (1, 2, 4):
            runs.train(processes, f"quickstart_{processes}", "--set", "training.shards=4", "--set",
                       "training.steps=40", "--set", "evaluation.every=20", "--set", "training.threads=1",
                       config=quickstart)
        check(runs.files("quickstart_2") == runs.files("quickstart_1") == runs.files("quickstart_4"),
              "the quickstart on 2 and 4 processes: the bits of 1")

        # the same bits on 1, 2 and 4 processes, with dropout and relative positions
        runs.train(1, "one", "--set", "training.shards=4")
        runs.train(2, "two", "--set", "training.shards=4")
        runs.train(4, "four")  # shards left out: one per process, and recorded
        one = runs.files("one")
        check(runs.files("two") == one, "4 shards on 2 processes: the bits of 1 process")
        check(runs.files("four") == one, "4 processes, shards left out: the bits of 4 shards in 1 process")
        with open(os.path.join(work, "four", "config.json")) as f:
            check(json.load(f)["training"]["shards"] == 4, "the run records its shards")
        check(len(runs.files("four")[0]) == 24 + 4,
              "rank 0 alone wrote metrics.jsonl: a line per step and per evaluation")

        # stopped on 2 processes, resumed on 1; stopped on 1, resumed on 2
        runs.train(2, "two_then_one", "--set", "training.shards=4", "--stop-after", "10")
        runs.train(1, "two_then_one", "--resume")  # the shards come from the run
        check(runs.files("two_then_one") == one, "stopped on 2 processes, resumed on 1: the same bits")
        runs.train(1, "one_then_two", "--set", "training.shards=4", "--stop-after", "13")
        runs.train(2, "one_then_two", "--resume")
        check(runs.files("one_then_two") == one, "stopped on 1 process, resumed on 2: the same bits")

        # float16, whose loss scale meets a summed loss: 1 and 2 processes, the same bits
        for processes in (1, 2):
            runs.train(processes, f"float16_{processes}", "--set", "training.shards=4", "--set",
                       'training.precision="float16"')
        check(runs.files("float16_2") == runs.files("float16_1"), "float16 on 2 processes: the bits of 1")

        # a process killed mid-run ends the job; resumed, the run ends as the uninterrupted one
        killed = os.path.join(work, "killed")
        command = runs.command(2, "killed", "--set", "training.shards=4", "--set", "training.steps=400",
                               "--set", "output.checkpoint_every=2")
        job = subprocess.Popen(command, env=ENVIRONMENT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 60
        while not os.path.exists(os.path.join(killed, "checkpoint", "state.json")) and time.time() < deadline:
            time.sleep(0.05)
        check(os.path.exists(os.path.join(killed, "checkpoint", "state.json")), "the run wrote a checkpoint")
        ranks = [pid for pid in children_of(job.pid)]
        check(len(ranks) >= 2, "mpirun started its 2 processes")
        os.kill(ranks[-1], signal.SIGKILL)
        killed_at = time.time()
        try:
            job.wait(timeout=30)
        except subprocess.TimeoutExpired:
            job.kill()
            sys.exit("FAILED: the job went on more than 30 s after one of its processes was killed")
        check(job.returncode != 0, f"the job ended {time.time() - killed_at:.1f} s after a process was killed "
                                   f"(exit {job.returncode})")
        runs.train(2, "killed", "--resume", "--set", "training.steps=400")
        runs.train(1, "uninterrupted", "--set", "training.shards=4", "--set", "training.steps=400",
                   "--set", "output.checkpoint_every=2")
        check(runs.files("killed") == runs.files("uninterrupted"), "resumed after the kill: the same bits")

        # refused, with one line that says why
        for processes, arguments, message in [
                (2, ["--set", "training.shards=3"], "/training/shards 3 cannot be shared by 2 processes"),
                (4, ["--set", "training.batch_size=2"], "/training/shards 4 (one per process) exceeds "
                                                        "training.batch_size 2"),
                (1, ["--set", "training.shards=17"], "expected at most training.batch_size 16")]:
            done = runs.train(processes, "refused", *arguments, expect=2)
            check(message in done.stderr, f"refused: {message}")
        # processes that disagree: another config, device or program on rank 1
        first = runs.command(1, "disagree", "--set", "training.shards=2")
        others = [(runs.command(1, "disagree", "--set", "training.shards=2", "--set", "training.steps=25"),
                   "another config (/training/steps)"),
                  (runs.command(1, "disagree", "--set", "training.shards=2", "--device", "guarded_cpu"),
                   "another device")]
        if args.emulated:
            others.append(([args.emulated] + first[1:], "another program"))
        for second, part in others:
            done = subprocess.run([args.mpirun, "--oversubscribe", "-np", "1", *first, ":", "-np", "1", *second],
                                  env=ENVIRONMENT, capture_output=True, text=True, timeout=120)
            check(done.returncode == 2 and f"rank 1 of 2 has {part} than rank 0" in done.stderr,
                  f"refused: rank 1 has {part}")
        # and other contents in a data file of the same name: each process in a folder of its own
        for side, label in (("a", "pos"), ("b", "neg")):
            os.makedirs(os.path.join(work, side))
            with open(os.path.join(work, side, "reviews.tsv"), "w") as f:
                f.writelines(f"{label if k % 2 else 'neg'}\tgood words {k}\n" for k in range(40))
        files = {"task": {"kind": "classification"}, "data": {"train": "reviews.tsv", "tokenizer": "word"},
                 "training": {"steps": 2, "batch_size": 8, "shards": 2, "threads": 1},
                 "output": {"dir": os.path.join(work, "files_run")}}
        with open(os.path.join(work, "files.json"), "w") as f:
            json.dump(files, f)
        on = [[args.mpirun, "--oversubscribe"]]
        for side in ("a", "b"):
            on += [["-np", "1", "-wdir", os.path.join(work, side), args.relgrad, "train", os.path.join(work, "files.json")]]
        done = subprocess.run(on[0] + on[1] + [":"] + on[2], env=ENVIRONMENT, capture_output=True, text=True,
                              timeout=120)
        check(done.returncode == 2 and "rank 1 of 2 has another reviews.tsv than rank 0" in done.stderr,
              "refused: rank 1 has other contents in reviews.tsv")

        # the model on a (emulated) cuda device: each process's gradients through host memory
        if args.emulated:
            on_device = Runs(args.emulated, args.mpirun, work)
            short = ["--device", "cuda", "--set", "training.shards=2", "--set", "training.steps=8",
                     "--set", "evaluation.every=8"]
            on_device.train(1, "cuda_one", *short)
            on_device.train(2, "cuda_two", *short)
            check(on_device.files("cuda_two") == on_device.files("cuda_one"),
                  "on the emulated cuda device, 2 processes: the bits of 1")
    print("all passed")


if __name__ == "__main__":
    main()
