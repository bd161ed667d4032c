"""The explorer's JSON API and command line (docs/explorer.md): every endpoint against the run's own
files and the other commands, every refusal, and concurrent clients."""
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

from conftest import ORDER, RELGRAD, SCHEMES, Server, unpack

ID = {name: n for n, name in enumerate(ORDER)}
PROMPT = "4 5 6 7 5 4 9"  # symbol ids of the synthetic tasks


def softmax_of_parts(layer):
    """The weights rebuilt from the score's two parts (masked pairs -inf), in float64."""
    score = unpack(layer["content"]).astype(np.float64) + unpack(layer["position"])
    allowed = unpack(layer["allowed"])
    if allowed is not None:
        score = np.where(allowed[None] == 1, score, -np.inf)
    e = np.exp(score - score.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def npy_weights(run_dir, prompt, work):
    out = os.path.join(work, "npy")
    shutil.rmtree(out, ignore_errors=True)
    done = subprocess.run([RELGRAD, "attention", run_dir, "--prompt", prompt, "--out", out], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    return [np.load(os.path.join(out, f"layer{n}.npy")) for n in range(len(os.listdir(out)))]


def checkpoint_parameter(run_dir, name):
    return np.load(os.path.join(run_dir, "checkpoint", "model", name + ".npy"))


def test_runs_and_metrics_are_the_run_files(server, runs):
    status, answer = server.request("api/runs")
    assert status == 200
    assert [run["name"] for run in answer] == ORDER
    for run in answer:
        directory = runs[run["name"]]
        with open(os.path.join(directory, "config.json")) as f:
            assert run["config"] == json.load(f)
        with open(os.path.join(directory, "summary.json")) as f:
            summary = json.load(f)
        assert run["summary"] == summary and run["parameters"] == summary["parameters"]
        assert run["position"] == run["config"]["model"]["position"]
        status, metrics = server.request(f"api/runs/{run['id']}/metrics")
        assert status == 200
        with open(os.path.join(directory, "metrics.jsonl")) as f:
            assert metrics == [json.loads(line) for line in f]


@pytest.mark.parametrize("name", SCHEMES + ["lm", "copy"])
def test_attention_is_relgrad_attention_exactly_and_softmax_of_the_parts_is_the_weights(server, runs, name, tmp_path):
    prompt = "the cat sat" if name == "lm" else PROMPT
    look = server.look(ID[name], prompt)
    expected = npy_weights(runs[name], prompt, str(tmp_path))
    assert len(look["layers"]) == len(expected) == 2
    length = len(look["tokens"])
    assert length == (len(prompt) if name == "lm" else len(prompt.split()))
    for layer, weights in zip(look["layers"], expected):
        got = unpack(layer["weights"])
        assert got.dtype == weights.dtype and np.array_equal(got, weights)  # the same bits
        # the layer's own split: softmax(content + position) is the weights (float32 rounding)
        assert np.abs(softmax_of_parts(layer) - weights).max() < 2e-6
        assert unpack(layer["content"]).shape == weights.shape
        # Shaw's value term alone has a value share; the gated layer alone a gate
        share = unpack(layer["value_share"])
        assert (share is not None) == (name in ("relative", "gated", "copy"))
        if share is not None:
            assert share.shape == (2, length) and (share >= 0).all() and (share <= 1).all()
        gate = unpack(layer["gate"])
        assert (gate is not None) == (name == "gated")
        if gate is not None:
            assert gate.shape == (2, length) and ((gate > 0) & (gate < 1)).all()
        # a causal model masks the later keys, the others nothing
        allowed = unpack(layer["allowed"])
        if name == "lm":
            assert np.array_equal(allowed, np.tril(np.ones((length, length), np.uint8)))
        else:
            assert allowed is None


def test_the_answer_is_the_models(server, runs):
    for name, kind in [("lm", "continuation"), ("copy", "target")]:
        prompt = "the cat" if name == "lm" else "4 5 6"
        answer = server.look(ID[name], prompt)["answer"]
        done = subprocess.run([RELGRAD, "generate", runs[name], "--prompt", prompt, "--max-tokens", "64"],
                              capture_output=True, text=True)
        assert answer == {"kind": kind, "text": done.stdout.rstrip("\n")}
    answer = server.look(ID["relative"], PROMPT)["answer"]
    assert answer["kind"] == "class" and abs(sum(answer["probabilities"]) - 1) < 1e-12
    assert answer["class"] == int(np.argmax(answer["probabilities"]))


def test_position_parameters_are_the_checkpoints(server, runs):
    def parameters(name):
        status, answer = server.request(f"api/runs/{ID[name]}/parameters")
        assert status == 200 and answer["position"] == name and len(answer["layers"]) == 2
        return answer

    p = parameters("relative")["layers"][1]
    table = checkpoint_parameter(runs["relative"], "encoder.layers.1.self_attention.rel_pos_emb_k.weight")
    assert p["kind"] == "relative" and p["k_left"] == p["k_right"] == 3
    # [K, H * Dh] per head -> [H, K, Dh]
    assert np.array_equal(unpack(p["E_K"]), table.reshape(7, 2, 8).transpose(1, 0, 2))
    p = parameters("gated")["layers"][0]
    gate = checkpoint_parameter(runs["gated"], "encoder.layers.0.self_attention.gate")
    assert p["kind"] == "gated" and p["token_gate"] is True
    assert np.allclose(p["gates"], 1 / (1 + np.exp(-gate.astype(np.float64))), rtol=0, atol=1e-7)
    p = parameters("alibi")["layers"][0]
    assert p == {"kind": "alibi", "slopes": [2 ** -4, 2 ** -8]}  # 2^(-8h/H), h = 1, 2
    p = parameters("rope")["layers"][0]
    assert p["kind"] == "rope" and np.allclose(p["frequencies"], 10000.0 ** (-2 * np.arange(4) / 8), rtol=1e-15)
    p = parameters("t5")["layers"][0]
    table = checkpoint_parameter(runs["t5"], "encoder.layers.0.self_attention.relative_attention_bias.weight")
    bias, distances = unpack(p["bias"]), p["distances"]
    assert bias.shape == (2, len(distances)) and distances[0] == -256 and distances[-1] == 256
    zero = distances.index(0)
    assert np.array_equal(bias[:, zero], table[0])  # distance 0: bucket 0
    assert np.array_equal(bias[:, zero + 1], table[17])  # one key after: the first bucket of the second half
    for name in ("none", "lm", "copy"):
        assert all(layer["kind"] in ("none", "t5", "relative") for layer in parameters_of(server, name)["layers"])
    assert parameters("none")["absolute"] is None
    similarity = unpack(parameters("learned")["absolute"]["similarity"])
    table = checkpoint_parameter(runs["learned"], "embed.positions.weight").astype(np.float64)[:128]
    unit = table / np.linalg.norm(table, axis=1, keepdims=True)
    assert similarity.shape == (16, 16) and np.abs(similarity - unit @ unit.T).max() < 1e-12  # the 16 positions trained
    similarity = unpack(parameters("sinusoidal")["absolute"]["similarity"])
    assert np.allclose(np.diag(similarity), 1, atol=1e-12) and np.allclose(similarity, similarity.T, atol=1e-12)


def parameters_of(server, name):
    status, answer = server.request(f"api/runs/{ID[name]}/parameters")
    assert status == 200
    return answer


BAD_REQUESTS = [
    # (method, path, body, status, words in the error)
    ("GET", "api/runs/99/metrics", None, 404, "no run 99"),
    ("GET", "api/runs/99/parameters", None, 404, "no run 99"),
    ("POST", "api/runs/99/attention", b'{"prompt": "4"}', 404, "no run 99"),
    ("GET", "api/runs/-1/metrics", None, 404, "no such"),
    ("GET", "api/runs/0/metrics/../../../../etc/passwd", None, 404, "no such"),
    ("GET", "../../etc/passwd", None, 404, "no such"),
    ("GET", "%2e%2e/%2e%2e/etc/passwd", None, 404, "no such"),
    ("GET", "..%2f..%2fetc%2fpasswd", None, 404, "no such"),
    ("GET", "/etc/passwd", None, 404, "no such"),
    ("GET", "config.json", None, 404, "no such"),
    ("GET", "api/runs/0/config.json", None, 404, "no such"),
    ("POST", "api/runs/0/attention", b"not json", 400, "JSON object"),
    ("POST", "api/runs/0/attention", b'{"text": "4 5"}', 400, "JSON object"),
    ("POST", "api/runs/0/attention", b'{"prompt": 45}', 400, "JSON object"),
    ("POST", "api/runs/0/attention", b'["4 5"]', 400, "JSON object"),
    ("POST", "api/runs/0/attention", b'{"prompt": "   "}', 400, "the prompt is empty"),
    ("POST", "api/runs/0/attention", b'{"prompt": "\\u000b\\f"}', 400, "the prompt has no tokens"),
    ("POST", "api/runs/0/attention", b'{"prompt": "4 x 5"}', 400, "'x' is not a symbol id"),
    ("POST", "api/runs/0/attention", b'{"prompt": "4 5 99999999999999999999"}', 400, "is not a symbol id"),
    ("POST", "api/runs/0/attention", json.dumps({"prompt": " ".join(["5"] * 600)}).encode(), 413,
     "600 tokens; the explorer shows at most 256"),
    ("POST", "api/runs/2/attention", json.dumps({"prompt": " ".join(["5"] * 17)}).encode(), 413,
     "the prompt has 17 tokens, but the model's learned positions cover 16"),
    ("POST", "api/runs/0/attention", json.dumps({"prompt": "4 " * 40000}).encode(), 413, "larger than this server"),
]


@pytest.mark.parametrize("method, path, body, status, words", BAD_REQUESTS)
def test_bad_requests_get_their_status_and_a_message_and_the_server_goes_on(server, method, path, body, status, words):
    got, answer = server.request(path, raw=body, method=method)
    assert got == status and words in answer["error"], answer
    assert server.look(ID["relative"], "4 5")["tokens"] == ["4", "5"]  # still serving


def test_another_sites_requests_are_refused(server):
    """A page elsewhere cannot name this server in its Host (DNS rebinding), nor POST anything but a
    form or text without a CORS preflight, which no answer here allows."""
    request = urllib.request.Request(server.url + "api/runs", headers={"Host": "attacker.example:8000"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 403 and "names another machine" in json.loads(refused.value.read())["error"]
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        request = urllib.request.Request(server.url + "api/runs/0/attention", data=b'{"prompt": "4 5"}')
        if content_type:
            request.add_header("Content-Type", content_type)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60)
        assert refused.value.code == 415 and "Content-Type: application/json" in json.loads(refused.value.read())["error"]
    for name in ("localhost", "127.0.0.1"):  # this machine's names are served
        port = server.url.rsplit(":", 1)[1].strip("/")
        request = urllib.request.Request(server.url + "api/runs", headers={"Host": f"{name}:{port}"})
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.status == 200


def test_learned_positions_answer_within_their_table(server):
    """A decoder-only model with learned positions answers in what is left of its table; with none
    left, the look still shows the weights and says why there is no answer."""
    status, runs_answer = server.request("api/runs")
    table = runs_answer[ID["copy-learned"]]["max_tokens"]
    look = server.look(ID["copy-learned"], " ".join(["5"] * (table - 4)))
    assert "error" not in look["answer"] and len(look["answer"]["text"].split()) <= 3
    look = server.look(ID["copy-learned"], " ".join(["5"] * (table - 1)))
    assert look["answer"] == {"kind": "target", "error": "no room is left in the table of learned positions"}
    assert len(look["layers"]) == 2 and unpack(look["layers"][0]["weights"]).shape == (2, table - 1, table - 1)


def test_answers_are_not_compressed_for_a_browser(server):
    """A browser accepts brotli and gzip; compressing megabytes of arrays would take seconds."""
    request = urllib.request.Request(server.url + "api/runs/0/attention", data=json.dumps({"prompt": PROMPT}).encode(),
                                     headers={"Accept-Encoding": "gzip, deflate, br", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.headers.get("Content-Encoding") is None
        assert response.headers["Content-Type"] == "application/json; charset=utf-8"
        assert json.loads(response.read())["tokens"] == PROMPT.split()


def test_an_address_longer_than_the_server_reads_is_refused(server):
    status, answer = server.request("api/runs/0/" + "x" * 10000)
    assert status == 414 and "address is longer" in answer["error"]


def test_concurrent_clients_get_right_answers(server):
    """16 clients, 96 requests: looks at four prompts in three runs, and malformed ones between."""
    expected = {}
    cases = []
    for prompt in ["4 5", "6 7 8 9", "5 " * 20, "9 8 7 6 5 4"]:
        for name in ("relative", "alibi", "gated"):
            expected[(name, prompt)] = server.look(ID[name], prompt)
            cases.append(("good", name, prompt))
            cases.append(("bad", *BAD_REQUESTS[len(cases) % len(BAD_REQUESTS)]))
    cases = (cases * 4)[:96]
    failures, lock = [], threading.Lock()

    def client(mine):
        for case in mine:
            if case[0] == "good":
                _, name, prompt = case
                status, answer = server.request(f"api/runs/{ID[name]}/attention", {"prompt": prompt})
                if status != 200 or answer != expected[(name, prompt)]:
                    with lock:
                        failures.append((case, status))
            else:
                _, method, path, body, status, words = case
                got, answer = server.request(path, raw=body, method=method)
                if got != status or words not in answer.get("error", ""):
                    with lock:
                        failures.append((path, got))

    threads = [threading.Thread(target=client, args=(cases[k::16],)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def explore(*arguments):
    return subprocess.run([RELGRAD, "explore", *arguments], capture_output=True, text=True, timeout=120)


def one_line_exit_2(done, words):
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and words in done.stderr, done.stderr


def test_command_line_refusals(runs, tmp_path):
    # a port another program listens on
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    one_line_exit_2(explore(runs["relative"], "--port", str(port)), f"cannot listen on 127.0.0.1:{port}")
    taken.close()
    # and a port another explorer listens on
    first = Server([runs["relative"]])
    port = first.url.rsplit(":", 1)[1].strip("/")
    one_line_exit_2(explore(runs["relative"], "--port", port), f"cannot listen on 127.0.0.1:{port}")
    first.stop()
    # a directory that is not a run, and a file
    one_line_exit_2(explore(runs["relative"], str(tmp_path)), f"{tmp_path}: not a trained run")
    # a run written by a relgrad of another version (its checkpoint's format version)
    other = str(tmp_path / "other_version")
    shutil.copytree(runs["alibi"], other)
    manifest_path = os.path.join(other, "checkpoint", "model", "manifest.json")
    with open(manifest_path) as f:
        manifest = json.load(f)
    manifest["version"] = 2
    with open(manifest_path, "w") as f:
        json.dump(manifest, f)
    one_line_exit_2(explore(other), "version 2, this relgrad reads version 1")
    # a config key this relgrad does not know
    with open(os.path.join(other, "config.json")) as f:
        config = json.load(f)
    config["model"]["future_option"] = 1
    with open(os.path.join(other, "config.json"), "w") as f:
        json.dump(config, f)
    one_line_exit_2(explore(other), "future_option")
    one_line_exit_2(explore(runs["relative"], "--prompt", "4 5"), "--prompt is for --export")
    one_line_exit_2(explore(runs["relative"], "--export", str(tmp_path / "x.html")), "give at least one --prompt")
    one_line_exit_2(explore(runs["relative"], "--export", str(tmp_path / "x.html"), "--prompt", "4 x"),
                    "'x' is not a symbol id")
    one_line_exit_2(explore(runs["relative"], "--port", "70000"), "70000")
    one_line_exit_2(explore(runs["relative"], "--host", "192.0.2.1", "--port", "0"),  # not this machine's
                    "cannot listen on 192.0.2.1:0")
    one_line_exit_2(explore(runs["relative"], "--host", "not an address"), "cannot listen on not an address:8000")
    # every address: served, with a warning
    everywhere = subprocess.Popen([RELGRAD, "explore", runs["relative"], "--host", "0.0.0.0", "--port", "0"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert everywhere.stdout.readline().startswith("explorer at http://0.0.0.0:")
    everywhere.send_signal(signal.SIGINT)
    _, err = everywhere.communicate(timeout=30)
    assert everywhere.returncode == 0 and "relgrad: warning: whoever reaches http://0.0.0.0:" in err
    one_line_exit_2(explore(), "runs is required")
    assert not (tmp_path / "x.html").exists()


def test_the_export_holds_the_apis_answers(server, runs, tmp_path):
    out = str(tmp_path / "view.html")
    done = explore(runs["relative"], runs["alibi"], "--export", out, "--prompt", "4 5 6", "--prompt", "7 8")
    assert done.returncode == 0, done.stderr
    with open(out) as f:
        page = f.read()
    start = page.index('<script id="relgrad-data" type="application/json">') + len(
        '<script id="relgrad-data" type="application/json">')
    data = json.loads(page[start:page.index("</script>", start)])
    assert [run["name"] for run in data["runs"]] == ["relative", "alibi"]
    for export_id, name in enumerate(["relative", "alibi"]):
        looks = data["looks"][str(export_id)]
        assert [look["prompt"] for look in looks] == ["4 5 6", "7 8"]
        served = server.look(ID[name], "7 8")
        assert looks[1]["layers"] == served["layers"] and looks[1]["answer"] == served["answer"]
        assert data["parameters"][str(export_id)] == parameters_of(server, name)
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")  # nothing fetched from anywhere
