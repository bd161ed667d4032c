"""What the explorer's tests share: tiny trained runs of every position scheme, and servers.

The runs train for a few steps (what they learned does not matter here, only that the numbers
shown are the model's); `relgrad explore --port 0` serves them on a free port of 127.0.0.1.
RELGRAD_PROGRAM names the relgrad program (ctest sets it).
"""
import base64
import json
import os
import signal
import subprocess
import urllib.error
import urllib.request

import numpy as np
import pytest

RELGRAD = os.environ.get("RELGRAD_PROGRAM", "build/relgrad")

BASE = {
    "model": {"layers": 2, "dim": 16, "heads": 2, "ff_dim": 32, "k": 3, "dropout": 0.0},
    "task": {"kind": "relative_order", "train_examples": 64, "test_examples": 16,
             "train_lengths": [6, 10], "test_lengths": [6, 14]},
    "training": {"steps": 6, "batch_size": 8, "learning_rate": 3e-3, "log_every": 1, "threads": 1},
    "evaluation": {"every": 3, "length_buckets": [8, 16]},
}
# one classifier per position scheme, and a language model and a copy model for their answers
SCHEMES = ["none", "sinusoidal", "learned", "relative", "gated", "rope", "alibi", "t5"]
TEXT = ("the cat sat on the mat and the dog sat on the log; a bird sang in the tree by the road. " * 40)


def train(work, name, config):
    path = os.path.join(work, name + ".json")
    with open(path, "w") as f:
        json.dump(config, f)
    out = os.path.join(work, name)
    done = subprocess.run([RELGRAD, "train", path, "--out", out], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """name -> run directory: one per scheme ("relative", "alibi", ...), "lm", "copy" and "copy-learned"."""
    work = str(tmp_path_factory.mktemp("runs"))
    made = {}
    for scheme in SCHEMES:
        config = json.loads(json.dumps(BASE))
        config["model"]["position"] = scheme
        if scheme == "gated":
            config["model"]["token_gate"] = True
        if scheme == "relative":
            config["model"]["share_across_heads"] = False
        made[scheme] = train(work, scheme, config)
    with open(os.path.join(work, "text.txt"), "w") as f:
        f.write(TEXT)
    lm = json.loads(json.dumps(BASE))
    lm["model"]["position"] = "t5"
    lm["task"] = {"kind": "language_model"}
    lm["data"] = {"train": os.path.join(work, "text.txt"), "max_length": 24}
    lm["evaluation"] = {"every": 3, "length_buckets": [8, 24]}
    made["lm"] = train(work, "lm", lm)
    copy = json.loads(json.dumps(BASE))
    copy["task"] = {"kind": "copy", "train_examples": 64, "test_examples": 8, "train_lengths": [4, 8],
                    "test_lengths": [4, 8]}
    made["copy"] = train(work, "copy", copy)
    # decoder-only with learned positions: prompt, separator and answer share the table
    copy["task"]["decoder_only"] = True
    copy["model"]["position"] = "learned"
    made["copy-learned"] = train(work, "copy-learned", copy)
    return made


class Server:
    """relgrad explore on a free port; stopped with Ctrl-C (SIGINT) at the end."""

    def __init__(self, run_dirs):
        self.process = subprocess.Popen([RELGRAD, "explore", *run_dirs, "--port", "0"], stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        assert line.startswith("explorer at http://127.0.0.1:"), line + self.process.stderr.read()
        self.url = line.split()[2]

    def request(self, path, body=None, raw=None, method=None):
        """(status, JSON answer) for GET path, or POST with a JSON body (or raw bytes)."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        request = urllib.request.Request(self.url + path.lstrip("/"), data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def look(self, run, prompt):
        status, answer = self.request(f"api/runs/{run}/attention", {"prompt": prompt})
        assert status == 200, answer
        return answer

    def stop(self):
        self.process.send_signal(signal.SIGINT)
        out, err = self.process.communicate(timeout=30)
        assert self.process.returncode == 0, err
        assert out.strip().endswith("stopped")


@pytest.fixture(scope="session")
def server(runs):
    """The runs in the order of `ORDER` (the API's ids are these positions)."""
    s = Server([runs[name] for name in ORDER])
    yield s
    s.stop()


ORDER = SCHEMES + ["lm", "copy", "copy-learned"]


def unpack(array):
    """An API array {dtype, shape, data} as a NumPy array."""
    if array is None:
        return None
    values = np.frombuffer(base64.b64decode(array["data"]), dtype=np.dtype(array["dtype"]).newbyteorder("<"))
    return values.reshape(array["shape"])
