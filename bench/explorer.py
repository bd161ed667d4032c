#!/usr/bin/env python3
"""The explorer's speed (docs/explorer.md): how long an attention request takes for the larger
bench model (4 layers, D=256, H=8, feed-forward 1024, as bench/training_throughput.py's "larger") at
L = 128, how soon the page is interactive after it starts loading from 127.0.0.1, and a load test:
16 clients sending 500 requests that mix valid and malformed ones, every answer checked.

    /usr/bin/python3 bench/explorer.py --relgrad build/relgrad [--json FILE]

The model trains for two steps (what it learned does not change the work of a look). Latencies
are wall-clock times seen by a client on the same machine, HTTP included.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from headless_chromium import chromium, wait_until_ready  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

LARGER = {
    "model": {"layers": 4, "dim": 256, "heads": 8, "ff_dim": 1024, "dropout": 0.1, "k": 8, "position": "relative"},
    "task": {"kind": "relative_order", "vocab": 16, "train_examples": 64, "test_examples": 16,
             "train_lengths": [64, 128], "test_lengths": [64, 128]},
    "training": {"steps": 2, "batch_size": 8, "log_every": 1},
    "evaluation": {"every": 2, "length_buckets": [128]},
}


def request(url, body=None):
    """(status, seconds, answer) of one request: the seconds until its last byte has arrived (the
    client's parsing of the JSON left out)."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    start = time.perf_counter()
    try:
        headers = {} if data is None else {"Content-Type": "application/json"}
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=120) as response:
            status, text = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, text = error.code, error.read()
    elapsed = time.perf_counter() - start
    return status, elapsed, json.loads(text)


def percentiles(seconds):
    ordered = sorted(seconds)
    return {"p50_ms": 1000 * statistics.median(ordered),
            "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))],
            "requests": len(ordered)}


def prompt_of(length):
    return " ".join(str(4 + (i * 7) % 12) for i in range(length))


def attention_latency(url, length, repeats):
    prompt = prompt_of(length)
    request(url + "api/runs/0/attention", {"prompt": prompt})  # warm-up
    seconds = []
    for _ in range(repeats):
        status, elapsed, _ = request(url + "api/runs/0/attention", {"prompt": prompt})
        assert status == 200
        seconds.append(elapsed)
    return percentiles(seconds)


def page_interactive(url, loads):
    """Milliseconds from the navigation's start until the page has drawn and listens (data-ready),
    and from a 128-token prompt's Enter until its heatmap is drawn (the request and the drawing)."""
    times, prompt_times = [], []
    with chromium() as browser:
        for _ in range(loads):
            browser.get(url)
            wait_until_ready(browser)
            times.append(float(browser.find_element("tag name", "body").get_attribute("data-ready")))
            start = time.perf_counter()
            browser.execute_script("document.getElementById('prompt').value = arguments[0];"
                                   "document.getElementById('look').click();", prompt_of(128))
            WebDriverWait(browser, 60).until(lambda b: b.execute_script(
                "return document.querySelectorAll('#heatmaps g.cells rect').length") == 128 * 128)
            prompt_times.append(1000 * (time.perf_counter() - start))
    return {"median_ms": statistics.median(times), "max_ms": max(times), "loads": loads,
            "prompt_128_median_ms": statistics.median(prompt_times), "prompt_128_max_ms": max(prompt_times)}


def load_test(url, clients, total):
    """`clients` threads sending `total` requests round-robin over valid and malformed kinds."""
    valid = {
        "runs": (url + "api/runs", None),
        "metrics": (url + "api/runs/0/metrics", None),
        "parameters": (url + "api/runs/0/parameters", None),
        "attention L=16": (url + "api/runs/0/attention", {"prompt": prompt_of(16)}),
        "attention L=128": (url + "api/runs/0/attention", {"prompt": prompt_of(128)}),
    }
    expected = {kind: request(*target)[2] for kind, target in valid.items()}
    malformed = {
        "no such run (404)": (url + "api/runs/7/metrics", None, 404),
        "a path outside (404)": (url + "../../etc/passwd", None, 404),
        "not JSON (400)": (url + "api/runs/0/attention", b"{prompt", 400),
        "not a symbol (400)": (url + "api/runs/0/attention", {"prompt": "4 x"}, 400),
        "too long a prompt (413)": (url + "api/runs/0/attention", {"prompt": prompt_of(300)}, 413),
    }
    kinds = list(valid) + list(malformed)
    results, lock = [], threading.Lock()

    def client(numbers):
        for n in numbers:
            kind = kinds[n % len(kinds)]
            if kind in valid:
                status, elapsed, answer = request(*valid[kind])
                right = status == 200 and answer == expected[kind]
            else:
                target, body, want = malformed[kind]
                status, elapsed, answer = request(target, body)
                right = status == want and "error" in answer
            with lock:
                results.append((kind, status, elapsed, right))

    threads = [threading.Thread(target=client, args=(range(k, total, clients),)) for k in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return {
        "clients": clients, "requests": len(results), "seconds": wall,
        "wrong_answers": sum(not right for _, _, _, right in results),
        "server_errors_on_valid": sum(kind in valid and status >= 500 for kind, status, _, _ in results),
        "all": percentiles([elapsed for _, _, elapsed, _ in results]),
        "by_kind": {kind: percentiles([e for k, _, e, _ in results if k == kind]) for kind in kinds},
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--relgrad", required=True, help="path to the relgrad program")
    parser.add_argument("--repeats", type=int, default=30, help="attention requests timed per length")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="relgrad_bench_explorer_")
    config = os.path.join(work, "larger.json")
    with open(config, "w") as f:
        json.dump(LARGER, f)
    run = os.path.join(work, "larger")
    subprocess.run([args.relgrad, "train", config, "--out", run], check=True, capture_output=True)
    server = subprocess.Popen([args.relgrad, "explore", run, "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        url = server.stdout.readline().split()[2]
        results = {"attention": {f"L={length}": attention_latency(url, length, args.repeats) for length in (16, 64, 128)}}
        for length, row in results["attention"].items():
            print(f"attention request, larger model, {length}: p50 {row['p50_ms']:.1f} ms, p99 {row['p99_ms']:.1f} ms")
        results["page"] = page_interactive(url, 5)
        page = results["page"]
        print(f"page interactive after {page['median_ms']:.0f} ms (median of 5 loads; slowest {page['max_ms']:.0f} ms); "
              f"a 128-token prompt drawn {page['prompt_128_median_ms']:.0f} ms after Enter "
              f"(slowest {page['prompt_128_max_ms']:.0f} ms)")
        results["load"] = load_test(url, 16, 500)
        load = results["load"]
        print(f"load test: {load['clients']} clients, {load['requests']} requests in {load['seconds']:.1f} s, "
              f"{load['wrong_answers']} wrong answers, {load['server_errors_on_valid']} server errors on valid ones; "
              f"p50 {load['all']['p50_ms']:.1f} ms, p99 {load['all']['p99_ms']:.1f} ms")
        for kind, row in load["by_kind"].items():
            print(f"  {kind:26s} p50 {row['p50_ms']:8.1f} ms  p99 {row['p99_ms']:8.1f} ms  ({row['requests']})")
    finally:
        server.terminate()
        server.wait()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    failed = results["load"]["wrong_answers"] or results["load"]["server_errors_on_valid"]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
