"""One description per options struct: a config's model section, a `relgrad layer` spec and
relgrad.nn's keyword arguments resolve the same options to the same values, and word their errors
alike. The program is the one in RELGRAD_PROGRAM (ctest sets it)."""
import json
import os
import subprocess

import numpy as np
import pytest

import relgrad
from relgrad import nn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RELGRAD = os.path.abspath(os.environ.get("RELGRAD_PROGRAM", os.path.join(ROOT, "build", "relgrad")))

# left out, ff_dim is 4 dim in all three (relgrad.nn once gave the struct's 256)
CASES = [
    {"dim": 128, "heads": 4},
    {"dim": 12, "heads": 3, "k": 2, "k_right": 5, "rank": 2, "relative_values": False, "attention": "fused"},
    {"dim": 8, "heads": 2, "position": "gated", "token_gate": True, "relative_init_std": 0.5, "ff_dim": 24},
    {"dim": 8, "heads": 1, "position": "none", "dropout": 0.25, "share_across_heads": False},
]


def spec_resolved(tmp_path, layer, options):
    """Runs `relgrad layer` on an encoder_layer spec with the layer's own weights: its resolved
    spec.json, and whether its output is the layer's."""
    in_dir, out_dir = tmp_path / "in", tmp_path / "out"
    in_dir.mkdir()
    x = np.random.default_rng(0).normal(size=(2, 3, options["dim"]))
    np.save(in_dir / "x.npy", x)
    for name, value in layer.state_dict().items():
        np.save(in_dir / (name + ".npy"), value)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"type": "encoder_layer", "dtype": "float64", **options}))
    subprocess.run([RELGRAD, "layer", "--spec", str(spec), "--in", str(in_dir), "--out", str(out_dir)], check=True)
    expected = layer.eval()(relgrad.tensor(x, dtype="float64")).numpy()
    return json.loads((out_dir / "spec.json").read_text()), np.abs(np.load(out_dir / "y.npy") - expected).max()


@pytest.mark.parametrize("options", CASES)
def test_config_spec_and_python_resolve_the_same_options(tmp_path, options):
    layer = nn.EncoderLayer(**options, seed=3, dtype="float64")
    from_python = layer.options
    from_config = relgrad.validate({"model": options})["model"]
    from_spec, difference = spec_resolved(tmp_path, layer, options)
    assert difference < 1e-12
    assert set(from_python) <= set(from_config) and set(from_python) <= set(from_spec)
    for key, value in from_python.items():
        assert from_config[key] == value, key
        assert from_spec[key] == value, key
    for key, value in options.items():  # what was given is kept; k is a shorthand for both sides
        if key != "k":
            assert from_python[key] == value
    assert from_python["ff_dim"] == options.get("ff_dim", 4 * options["dim"])
    assert layer.feed_forward.fc1.weight.shape == (from_python["ff_dim"], options["dim"])


BAD = [  # (option, value, what was expected, Python's exception); the value as JSON or Python writes it
    ("dim", 0, "an integer in [1, 8192]", ValueError),
    ("dropout", 1.5, "a number in [0, 0.99]", ValueError),
    ("position", "kerple", 'one of "none", "sinusoidal", "learned", "relative", "gated", "rope", "alibi", "t5"', ValueError),
    ("heads", 3, "a divisor of dim = 64", ValueError),
    ("k_left", 5000, "an integer in [0, 4096]", ValueError),
    ("token_gate", 1, "true or false", TypeError),
]


@pytest.mark.parametrize("key, value, expected, python_error", BAD)
def test_bad_options_are_worded_alike(tmp_path, key, value, expected, python_error):
    with pytest.raises(ValueError) as from_config:
        relgrad.validate({"model": {key: value}})
    assert str(from_config.value) == f"config: /model/{key}: got {json.dumps(value)}, expected {expected}"
    with pytest.raises(python_error) as from_python:
        nn.EncoderLayer(**{key: value})
    assert str(from_python.value) == f"keyword argument '{key}': got {value!r}, expected {expected}"
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"type": "encoder_layer", key: value}))
    done = subprocess.run([RELGRAD, "layer", "--spec", str(spec), "--in", str(tmp_path), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip() == f"relgrad: error: {spec}: /{key}: got {json.dumps(value)}, expected {expected}"


def test_gated_attention_has_no_fused_form():
    with pytest.raises(ValueError, match="gated layer has no fused form"):
        relgrad.validate({"model": {"position": "gated", "attention": "fused"}})
    with pytest.raises(ValueError, match="no fused form"):
        nn.GatedPositionAttention(8, 2, attention="fused")
    layer = nn.GatedPositionAttention(8, 2)
    layer.impl = "fused"  # the attribute may change after construction: the forward refuses
    with pytest.raises(ValueError, match="no fused form"):
        layer(relgrad.zeros(1, 3, 8))


def test_docstrings_list_every_option():
    doc = nn.EncoderLayer.__init__.__doc__
    for key in nn.EncoderLayer(dim=8, heads=2).options:
        assert "\n  " + key + ": " in doc, key
    assert "\n  k: an integer in [0, 4096] (default 8)" in nn.RelativeMultiHeadAttention.__init__.__doc__


@pytest.mark.parametrize("layer", [nn.MultiHeadAttention, nn.RelativeMultiHeadAttention, nn.GatedPositionAttention,
                                   nn.RotaryMultiHeadAttention, nn.AlibiAttention, nn.T5BiasAttention])
def test_attention_sizes_given_by_position_are_checked_as_keywords_are(layer):
    with pytest.raises(ValueError, match=r"'dim': got 0, expected an integer in \[1, 8192\]"):
        layer(0, 1)
    with pytest.raises(ValueError, match=r"'heads': got 3, expected a divisor of dim = 64"):
        layer(64, 3)
    assert layer(64, 4).head_dim == 16
