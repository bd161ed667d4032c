"""The experiment scripts end to end on two tiny runs: scripts/experiments.py trains them, writes
each run's record and the results table, does not train a recorded run again, and keeps the
entries of the variants it did not tabulate; scripts/plot_results.py draws the plots from the records alone. ctest passes the relgrad program
in RELGRAD_PROGRAM."""
import fcntl
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import experiments  # noqa: E402
import plot_results  # noqa: E402

RELGRAD = os.path.abspath(os.environ.get("RELGRAD_PROGRAM", os.path.join(ROOT, "build", "relgrad")))
# The length task's config, a few seconds per run.
SMALL = ["model.layers=1", "model.dim=16", "model.ff_dim=32", "model.heads=2", "training.steps=20",
         "task.train_examples=200", "task.test_examples=60", "evaluation.every=10", "training.log_every=5"]


TINY_LENGTH = {
    "config": os.path.abspath(os.path.join(ROOT, "configs", "experiments", "length.json")),
    "attention_prompt": experiments.LENGTH_PROMPT,
    "variants": {"sinusoidal": ["model.position=sinusoidal"] + SMALL,
                 "relative": ["model.position=relative", "model.k=4"] + SMALL},
}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """Runs `experiments.py length --seeds 1 2` on a tiny length experiment of two variants, in a
    directory of its own, then again without the runs' directories; returns (directory, records
    folder, the script's two outputs)."""
    work = tmp_path_factory.mktemp("sweep")
    patch = pytest.MonkeyPatch()
    patch.chdir(work)
    patch.setattr(experiments, "DATA", str(work / "data"))
    patch.setitem(experiments.EXPERIMENTS, "length", TINY_LENGTH)
    patch.setattr(sys, "argv", ["experiments.py", "length", "--seeds", "1", "2", "--relgrad", RELGRAD])
    outputs = []
    for sitting in range(2):
        if sitting == 1:  # the records stand without the runs' directories
            shutil.rmtree(work / "runs")
        with open(work / "output.txt", "w") as out:
            patch.setattr(sys, "stdout", out)
            try:
                experiments.main()
            finally:
                patch.setattr(sys, "stdout", sys.__stdout__)
        outputs.append((work / "output.txt").read_text())
    yield work, work / "data" / "length", outputs
    patch.undo()


def test_every_run_has_its_record(sweep):
    _, data, _ = sweep
    for variant in ("sinusoidal", "relative"):
        for seed in (1, 2):
            record = json.loads((data / variant / f"seed{seed}.json").read_text())
            assert record["variant"] == variant and record["seed"] == seed
            assert record["summary"]["steps"] == 20 and "accuracy" in record["summary"]["final"]
            assert [row["step"] for row in record["metrics"] if "eval" in row] == [0, 10, 20]
            assert record["steps_per_second"] > 0
            weights = record["attention"]["last_layer"]  # [heads, L, L], rows summing to 1
            assert record["attention"]["prompt"] == experiments.LENGTH_PROMPT
            assert len(weights) == 2 and all(len(head) == 32 and len(head[0]) == 32 for head in weights)
            assert all(abs(sum(row) - 1) < 1e-3 for head in weights for row in head)
            if variant == "relative":
                assert len(record["relative_table"]) == 2 * 4 + 1 and len(record["relative_table"][0]) == 8
            else:
                assert "relative_table" not in record


def test_results_are_the_records_mean_and_spread(sweep):
    _, data, _ = sweep
    results = json.loads((data / "results.json").read_text())
    assert set(results) == {"sinusoidal", "relative"}
    for variant, entry in results.items():
        accuracies = [json.loads((data / variant / f"seed{seed}.json").read_text())["summary"]["final"]["accuracy"]
                      for seed in (1, 2)]
        assert entry["seeds"] == [1, 2] and entry["accuracy"]["values"] == accuracies
        assert entry["accuracy"]["mean"] == pytest.approx(statistics.mean(accuracies))
        assert entry["accuracy"]["std"] == pytest.approx(statistics.stdev(accuracies))


def test_a_recorded_run_is_not_trained_again(sweep):
    _, _, (first, second) = sweep
    assert first.count("relgrad train") == 4 and "relgrad train" not in second
    assert first.count("| relative |") == 1 and second.count("| relative |") == 1


def test_a_pair_models_records_keep_its_encoders_table_and_its_decoders_apart(tmp_path):
    """Parameter names sort the decoder's layers ("decoder_layers.0") before the encoder's
    ("encoder.layers.0"); the record's relative_table is the encoder's all the same."""
    model = tmp_path / "checkpoint" / "model"
    model.mkdir(parents=True)
    for name, value in (("decoder_layers.0", 1.0), ("encoder.layers.0", 2.0), ("encoder.layers.1", 3.0)):
        np.save(model / f"{name}.self_attention.rel_pos_emb_k.weight.npy", np.full((5, 2), value, np.float32))
    tables = experiments.relative_tables(str(tmp_path))
    assert tables == {"relative_table": [[2.0] * 2] * 5, "decoder_relative_table": [[1.0] * 2] * 5}
    assert experiments.relative_tables(str(tmp_path / "none")) == {}


def test_a_part_of_a_sweep_keeps_the_other_entries_and_waits_its_turn(sweep, tmp_path):
    """`--variants relative --seeds 1 --finished-only` (in a process of its own) replaces only the
    relative entry, and not while another process holds the experiment's folder."""
    work, _, _ = sweep
    shutil.copytree(work / "data", tmp_path / "data")
    data = tmp_path / "data" / "length"
    before = (data / "results.json").read_text()
    program = (f"import sys; sys.path.insert(0, {os.path.join(ROOT, 'scripts')!r}); import experiments; "
               f"experiments.DATA = {str(tmp_path / 'data')!r}; experiments.EXPERIMENTS['length'] = {TINY_LENGTH!r}; "
               "sys.argv = ['experiments.py', 'length', '--seeds', '1', '--variants', 'relative', '--finished-only', "
               f"'--relgrad', {RELGRAD!r}]; experiments.main()")
    folder = os.open(data, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)  # another part writing its entries
        part = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
        time.sleep(2)
        assert part.poll() is None and (data / "results.json").read_text() == before
    finally:
        os.close(folder)
    assert part.wait(timeout=60) == 0 and "written:" in part.stdout.read()
    results = json.loads((data / "results.json").read_text())
    assert results["relative"]["seeds"] == [1] and results["sinusoidal"]["seeds"] == [1, 2]
    assert results["sinusoidal"] == json.loads(before)["sinusoidal"]
    assert sorted(os.listdir(data)) == ["relative", "results.json", "sinusoidal"]


def test_plots_come_from_the_records_alone(sweep, tmp_path, monkeypatch):
    work, data, _ = sweep
    monkeypatch.setattr(plot_results, "DATA", str(work / "data"))
    monkeypatch.setattr(plot_results, "OUT", str(tmp_path))
    plot_results.record.cache_clear()
    plot_results.main()
    for name in ("length_loss.png", "length_by_length.png", "length_relative_table.png", "length_attention.png"):
        assert (tmp_path / name).stat().st_size > 1000


def test_a_job_array_lists_the_sweep_and_runs_one_run_a_task(tmp_path, monkeypatch, capsys):
    # --list numbers the runs (variant by variant, seed by seed); --only N trains that run alone
    # and writes its record, as one task of `sbatch --array` would; a number outside is refused
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(experiments, "DATA", str(tmp_path / "data"))
    monkeypatch.setitem(experiments.EXPERIMENTS, "length", TINY_LENGTH)
    base = ["experiments.py", "length", "--seeds", "1", "2", "--relgrad", RELGRAD]
    monkeypatch.setattr(sys, "argv", base + ["--list"])
    experiments.main()
    assert capsys.readouterr().out.splitlines() == [
        "0 length sinusoidal seed 1", "1 length sinusoidal seed 2", "2 length relative seed 1",
        "3 length relative seed 2"]
    assert not (tmp_path / "runs").exists()
    monkeypatch.setattr(sys, "argv", base + ["--only", "2"])
    experiments.main()
    assert os.listdir(tmp_path / "data" / "length") == ["relative"]
    assert os.listdir(tmp_path / "data" / "length" / "relative") == ["seed1.json"]
    monkeypatch.setattr(sys, "argv", base + ["--only", "4"])
    with pytest.raises(SystemExit) as refused:
        experiments.main()
    assert refused.value.code == 2
    assert capsys.readouterr().err == "experiments.py: --only 4: the sweep has 4 runs, 0 to 3 (see --list)\n"


def committed_records(monkeypatch):
    """plot_results reading docs/results/data/ and configs/ as it does run from the repository's root."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(plot_results, "DATA", os.path.join("docs", "results", "data"))
    plot_results.record.cache_clear()
    plot_results.paper.cache_clear()


def test_results_md_section_6_tables_are_the_records_as_plot_results_prints_them(capsys, monkeypatch):
    # docs/results.md copies the tables that plot_results prints from docs/results/data/family:
    # each printed row must be in the page as printed, so a record and the page cannot drift apart.
    committed_records(monkeypatch)
    family = plot_results.family_runs(plot_results.load("family"))
    plot_results.family_tables(family)
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line]
    page = open(os.path.join(ROOT, "docs", "results.md"), encoding="utf-8").read().splitlines()
    assert len(printed) > 20
    missing = [line for line in printed if line not in page]
    assert not missing, "docs/results.md lacks these rows as the records give them:\n" + "\n".join(missing)


def test_precision_md_accuracies_are_the_records_of_the_precision_experiments(monkeypatch):
    committed_records(monkeypatch)
    # docs/precision.md's "What 16 bits cost in accuracy" quotes each seed's test accuracy from
    # docs/results/data/precision*/results.json, to three decimals.
    page = open(os.path.join(ROOT, "docs", "precision.md"), encoding="utf-8").read().splitlines()
    page = page[page.index("### What 16 bits cost in accuracy"):]
    rows = {"quickstart": "precision", "sentiment, IMDB": "precision-sentiment"}
    for label, experiment in rows.items():
        row = next(line for line in page if line.startswith(f"| {label} |"))
        cells = [cell.strip() for cell in row.strip("|").split("|")][1:4]
        results = plot_results.load(experiment)
        for precision, cell in zip(("float32", "bfloat16", "float16"), cells):
            quoted = [float(item.split("(")[0]) for item in cell.split(", ")]
            recorded = results[precision]["accuracy"]["values"]
            assert quoted == pytest.approx(recorded, abs=5e-4), f"{label}, {precision}: {quoted} against {recorded}"
