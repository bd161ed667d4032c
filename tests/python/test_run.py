"""Training from Python: relgrad.train with the command line's keys, defaults and errors, and
the commands on a trained run."""
import base64
import html
import json
import os
import re
import shutil
import signal
import threading
import time

import numpy as np
import pytest

import relgrad

# A run of a few seconds: the quickstart's task and model, smaller.
SMALL = ["task.train_examples=200", "task.test_examples=40", "training.steps=20", "evaluation.every=10",
         "model.layers=1", "model.dim=16", "model.ff_dim=32", "model.heads=2"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    summary = relgrad.train(out=str(out), set=SMALL)
    assert summary["steps"] == 20 and summary["position"] == "relative" and "accuracy" in summary["final"]
    return out


def test_train_writes_the_run_directory(run_dir):
    for name in ("config.json", "metrics.jsonl", "summary.json", "checkpoint"):
        assert (run_dir / name).exists()
    written = json.loads((run_dir / "config.json").read_text())
    assert written["training"]["steps"] == 20 and written["model"]["dim"] == 16


def test_config_as_dict_path_and_overrides_agree(tmp_path):
    config = relgrad.quickstart_config()
    config["training"]["steps"] = 7
    resolved = relgrad.validate(config)
    assert resolved["training"]["steps"] == 7 and resolved["training"]["schedule"] == "cosine"  # defaults filled in
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert relgrad.validate(str(path)) == resolved
    assert relgrad.validate(path) == resolved  # a pathlib.Path too
    assert relgrad.validate(set=["training.steps=7"]) == resolved


@pytest.mark.parametrize("config, overrides, message", [
    ({"training": {"steps": -1}}, [], "config: /training/steps: got -1"),
    ({"training": {"stepz": 1}}, [], "stepz"),
    ({"model": {"position": "kerple"}}, [], "kerple"),
    (None, ["training.steps"], "training.steps"),
    ({"training": {"learning_rate": float("nan")}}, [],
     "config: /training/learning_rate is NaN or infinite, a number JSON cannot hold"),
    ({"task": {"train_lengths": [4, float("inf")]}}, [], "config: /task/train_lengths/1 is NaN or infinite"),
])
def test_bad_configs_raise_value_error(config, overrides, message):
    with pytest.raises(ValueError, match=message):
        relgrad.validate(config, set=overrides)
    with pytest.raises(ValueError, match=message):
        relgrad.train(config, set=overrides)


def test_a_config_that_holds_itself_is_a_value_error_not_a_hang():
    looped = {"model": {}}
    looped["model"]["x"] = looped
    in_a_list = {"evaluation": {"length_buckets": [8]}}
    in_a_list["evaluation"]["length_buckets"].append(in_a_list["evaluation"]["length_buckets"])
    for config, path in ((looped, "/model/x"), (in_a_list, "/evaluation/length_buckets/1")):
        with pytest.raises(ValueError, match=f"config: {path} refers back to a dict or list that holds it"):
            relgrad.validate(config)
    shared = {"lengths": [8, 24]}  # one list twice, without a loop, is what JSON writes twice
    assert relgrad.validate({"task": {"train_lengths": shared["lengths"], "test_lengths": shared["lengths"]}})


def test_bad_config_arguments(tmp_path):
    with pytest.raises(TypeError, match="a config is a dict"):
        relgrad.train(42)
    with pytest.raises(ValueError, match="missing"):
        relgrad.validate(str(tmp_path / "nothing.json"))
    with pytest.raises(ValueError, match="is a directory"):
        relgrad.validate(str(tmp_path))


def test_loaded_run(run_dir):
    run = relgrad.load_run(str(run_dir))
    assert run.task == "relative_order" and run.config["model"]["dim"] == 16
    assert isinstance(run.model, relgrad.nn.SequenceClassifier) and not run.model.training
    metrics = run.metrics()
    assert [m["step"] for m in metrics if "eval" in m] == [0, 10, 20]
    assert all(m["loss"] > 0 for m in metrics if "eval" not in m)
    assert metrics[-1]["eval"] == run.summary()["final"]
    evaluation = run.evaluate()
    assert evaluation["accuracy"] == run.summary()["final"]["accuracy"]
    weights = run.attention("4 5 6 7")
    assert len(weights) == 1 and weights[0].shape == (2, 4, 4)
    np.testing.assert_allclose(weights[0].sum(-1), 1, rtol=1e-5)
    # the loaded model gives the run's own predictions
    logits = run.model(relgrad.tensor([[4, 5, 6, 7]]))
    assert logits.shape == (1, 2)


def test_explore_shows_the_exported_view_inline(run_dir, tmp_path):
    view = relgrad.explore(str(run_dir), prompt="4 5 6 7", prompts=["8 9"])
    marker = '<script id="relgrad-data" type="application/json">'
    start = view.html.index(marker) + len(marker)
    data = json.loads(view.html[start:view.html.index("</script>", start)])
    assert [look["prompt"] for look in data["looks"]["0"]] == ["4 5 6 7", "8 9"]
    weights = relgrad.load_run(str(run_dir)).attention("4 5 6 7")[0]
    shown = np.frombuffer(base64.b64decode(data["looks"]["0"][0]["layers"][0]["weights"]["data"]), np.float32)
    assert np.array_equal(shown.reshape(weights.shape), weights)
    # inline: the page in an iframe of its own, every quote of it escaped
    inline = re.fullmatch(r'<iframe srcdoc="([^"]*)" style="[^"]*"></iframe>', view._repr_html_())
    assert inline and html.unescape(inline.group(1)) == view.html
    view.save(str(tmp_path / "view.html"))
    assert (tmp_path / "view.html").read_text() == view.html
    with pytest.raises(ValueError, match="not a symbol id"):
        relgrad.explore(str(run_dir), prompt="4 banana")
    with pytest.raises(ValueError, match="give a prompt to show"):
        relgrad.explore([str(run_dir)])


def test_train_in_a_precision(tmp_path):
    summary = relgrad.train(out=str(tmp_path / "half"), set=SMALL + ['training.precision="float16"'])
    assert summary["precision"] == "float16"
    lines = [json.loads(line) for line in (tmp_path / "half" / "metrics.jsonl").read_text().splitlines()]
    assert all("loss_scale" in line for line in lines if "eval" not in line)
    run = relgrad.load_run(str(tmp_path / "half"))
    assert run.evaluate()["accuracy"] == summary["final"]["accuracy"]  # read back in float16
    with pytest.raises(ValueError, match="precision"):
        relgrad.train(out=str(tmp_path / "bad"), set=SMALL + ['training.precision="float64"'])


def test_run_errors(run_dir, tmp_path):
    with pytest.raises(ValueError, match="checkpoint"):
        relgrad.load_run(str(tmp_path))
    incomplete = tmp_path / "incomplete"
    shutil.copytree(run_dir, incomplete)
    (incomplete / "checkpoint" / "state.json").unlink()
    with pytest.raises(ValueError, match=r"checkpoint/state.json: missing, expected the checkpoint's state "
                                         r"\(deleted, or an incomplete checkpoint\)"):
        relgrad.load_run(str(incomplete))
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    with pytest.raises(ValueError, match=r"a_file: not a directory, expected the run's directory \(output.dir\)"):
        relgrad.train(out=str(a_file), set=SMALL)
    with pytest.raises(ValueError, match=r"a_file/run: cannot create the run's directory \(Not a directory\)"):
        relgrad.train(out=str(a_file / "run"), set=SMALL)
    model = relgrad.nn.Linear(2, 3)
    with pytest.raises(ValueError, match=r"nowhere/manifest.json: missing, expected a saved state's manifest.json"):
        model.load(str(tmp_path / "nowhere"))
    relgrad.nn.Linear(3, 2).save(str(tmp_path / "other"))
    with pytest.raises(ValueError, match=r"manifest.json: parameter 'weight' has shape \[2, 3\], the model's is \[3, 2\]"):
        model.load(str(tmp_path / "other"))
    run = relgrad.load_run(str(run_dir))
    with pytest.raises(ValueError, match="not a symbol id"):
        run.attention("4 banana")
    with pytest.raises(ValueError, match="generates its own test data"):
        run.evaluate(data="x.tsv")
    # Python's own words: the keyword, not the command line's flag; a str UTF-8 cannot hold, named
    with pytest.raises(ValueError, match="generate: max_tokens must be positive, got 0"):
        run.generate("4 5", max_tokens=0)
    for method in (run.generate, run.attention):
        with pytest.raises(ValueError, match=f"{method.__name__}: prompt is not valid Unicode text"):
            method("4 \ud800")


def test_a_prompt_past_the_learned_positions_is_refused(tmp_path):
    # relative_order trains and tests on up to 16 tokens here: 18 positions with <bos> and <eos>
    lengths = ["task.train_lengths=[8,12]", "task.test_lengths=[8,16]", "model.position=\"learned\""]
    out = str(tmp_path / "learned")
    relgrad.train(out=out, set=SMALL + lengths)
    run = relgrad.load_run(out)
    assert len(run.attention(" ".join(["5"] * 18))) == 1  # one layer's weights
    with pytest.raises(ValueError, match=r"^attention: the prompt has 19 tokens, but the model's learned positions "
                                         r"cover 18 \(the longest input it was trained for\); give a shorter prompt$"):
        run.attention(" ".join(["5"] * 19))


def test_training_releases_the_gil(tmp_path):
    ticks, done = [], threading.Event()

    def tick():
        while not done.is_set():
            ticks.append(1)
            done.wait(0.001)

    ticker = threading.Thread(target=tick)
    ticker.start()
    started = time.perf_counter()
    try:
        relgrad.train(out=str(tmp_path / "run"), set=SMALL + ["training.steps=100"])
    finally:
        done.set()
        ticker.join()
    elapsed = time.perf_counter() - started
    # a tick a millisecond while the GIL is free; none while training holds it
    assert elapsed > 0.05 and len(ticks) > 0.2 * elapsed / 0.001


def test_ctrl_c_ends_training_with_a_checkpoint_and_resume_continues(tmp_path, capfd):
    out = tmp_path / "run"
    # no checkpoint before the last step but the one the interrupt writes
    longer = SMALL + ["training.steps=200", "evaluation.every=200", "output.checkpoint_every=1000"]

    def press_ctrl_c_once_training_runs():
        while not (out / "metrics.jsonl").exists():  # written by the evaluation at step 0
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)

    presser = threading.Thread(target=press_ctrl_c_once_training_runs)
    presser.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            relgrad.train(out=str(out), set=longer)
    finally:
        presser.join()
    # stopped early, with the checkpoint of the step it stopped at
    assert not (out / "summary.json").exists()
    stopped_at = json.loads((out / "checkpoint" / "state.json").read_text())["step"]
    assert 0 < stopped_at < 200
    assert f"relgrad.train: interrupted after step {stopped_at}, checkpoint written" in capfd.readouterr().err
    summary = relgrad.train(out=str(out), set=longer, resume=True)
    assert summary["steps"] == 200
    assert (out / "summary.json").exists()
