"""relgrad.nn from Python: every layer built and run, parameters and state_dict, modes, devices,
the three attention forms agreeing, greedy decoding, and the errors."""
import gc
import json

import numpy as np
import pytest

import relgrad
from relgrad import nn

MODEL = dict(dim=8, heads=2, ff_dim=16, layers=1, dropout=0.0, seed=3)


def test_basic_layers_shapes_and_names():
    x = relgrad.randn(2, 5, 8, seed=1)
    linear = nn.Linear(8, 3, seed=1)
    assert linear(x).shape == (2, 5, 3)
    assert [name for name, _ in linear.named_parameters()] == ["weight", "bias"]
    assert nn.Linear(8, 3, bias=False).bias is None
    assert nn.Embedding(10, 4)(relgrad.tensor([[1, 2, 3]])).shape == (1, 3, 4)
    norm = nn.LayerNorm(8)
    np.testing.assert_allclose(norm(x).numpy().mean(-1), 0, atol=1e-6)
    assert nn.FeedForward(8, 16)(x).shape == (2, 5, 8)
    assert [n for n, _ in nn.FeedForward(8, 16).named_parameters()] == ["fc1.weight", "fc1.bias", "fc2.weight",
                                                                        "fc2.bias"]
    dropout = nn.Dropout(0.5, seed=1)
    assert (dropout(relgrad.ones(100)).numpy() == 0).any()
    np.testing.assert_array_equal(dropout.eval()(relgrad.ones(100)).numpy(), np.ones(100))


def test_position_layers():
    pe = nn.SinusoidalPositionalEncoding(4).encoding(3).numpy()
    np.testing.assert_allclose(pe[2], [np.sin(2), np.cos(2), np.sin(2 / 100), np.cos(2 / 100)], rtol=1e-6)
    assert nn.LearnedPositionalEmbedding(16, 8)(relgrad.zeros(1, 5, 8)).shape == (1, 5, 8)
    relative = nn.RelativePositionEmbedding(4, heads=2, k=2, share_across_heads=False)
    index = relative.index(4, 4).numpy()
    np.testing.assert_array_equal(index, np.clip(np.arange(4)[None] - np.arange(4)[:, None], -2, 2) + 2)
    assert relative.buckets == 5 and relative.table().shape == (2, 5, 4)
    assert relative.lookup(3, 3).shape == (2, 3, 3, 4)
    asymmetric = nn.RelativePositionEmbedding(4, k_left=1, k_right=3)
    assert asymmetric.buckets == 5 and asymmetric.k_left == 1


def test_relative_options_values_and_init_std():
    keys_only = nn.RelativeMultiHeadAttention(8, 2, k=2, relative_values=False, seed=1)
    assert not keys_only.value_term and nn.RelativeMultiHeadAttention(8, 2, k=2).value_term
    assert not any("rel_pos_emb_v" in name for name, _ in keys_only.named_parameters())
    assert keys_only(relgrad.randn(1, 4, 8, seed=2)).shape == (1, 4, 8)
    model = nn.SequenceClassifier(10, 2, position="relative", relative_values=False, **MODEL)
    names = [name for name, _ in model.named_parameters()]
    assert any("rel_pos_emb_k" in n for n in names) and not any("rel_pos_emb_v" in n for n in names)
    # entries drawn from N(0, init_std^2) cut at 2 init_std: a spread of 0.88 init_std
    for init_std in (0.02, 0.5):
        table = nn.RelativePositionEmbedding(16, k=64, relative_init_std=init_std, seed=3).weight.numpy()
        assert abs(table.std() / init_std - 0.88) < 0.05 and np.abs(table).max() <= 2 * init_std
    wide = nn.GatedPositionAttention(8, 2, k=2, relative_init_std=0.5, seed=1).rel_pos_emb_k.weight.numpy()
    assert np.abs(wide).max() > 0.1


def test_adamw_parameter_groups():
    # Both gradients are 1, so Adam's first update is g / |g| = 1 (up to eps) and each parameter
    # ends where its group's learning rate and weight decay put it.
    a = relgrad.tensor(np.array([1.0]), requires_grad=True)
    b = relgrad.tensor(np.array([1.0]), requires_grad=True)
    adam = relgrad.AdamW([{"params": [a], "weight_decay": 0.1}, {"params": [b], "lr": 0.1}], lr=0.01, weight_decay=0.0)
    (a + b).sum().backward()
    adam.step()
    np.testing.assert_allclose(a.numpy(), [1.0 * (1 - 0.01 * 0.1) - 0.01 / (1 + 1e-8)], rtol=1e-15)
    np.testing.assert_allclose(b.numpy(), [1.0 - 0.1 / (1 + 1e-8)], rtol=1e-15)
    assert [(len(g["params"]), g["lr"], g["weight_decay"]) for g in adam.param_groups] == [(1, 0.01, 0.1),
                                                                                          (1, 0.1, 0.0)]
    assert adam.param_groups[0]["params"][0]._id == a._id and adam.steps == 1
    assert len(relgrad.AdamW([a, b]).param_groups) == 1
    assert relgrad.AdamW([a, b]).param_groups[0]["lr"] == 1e-3  # PyTorch's default
    assert len(relgrad.AdamW(p for p in (a, b)).param_groups[0]["params"]) == 2  # any iterable
    assert len(relgrad.AdamW([{"params": a}]).param_groups[0]["params"]) == 1  # a group of one tensor, as PyTorch


def test_a_learning_rate_written_into_param_groups_is_the_next_steps():
    a = relgrad.tensor(np.array([1.0]), requires_grad=True)
    adam = relgrad.AdamW([a], lr=0.01, weight_decay=0.01)
    a.sum().backward()  # the gradient stays 1 for both steps
    adam.param_groups[0]["lr"] = 0.0
    adam.step()  # the moments move, the parameter does not (no decay either: it is lr times weight_decay)
    np.testing.assert_array_equal(a.numpy(), [1.0])
    adam.param_groups[0]["lr"] = 0.1
    adam.step()  # m_hat = v_hat = 1 at step 2 too
    np.testing.assert_allclose(a.numpy(), [1.0 * (1 - 0.1 * 0.01) - 0.1 / (1 + 1e-8)], rtol=1e-15)


@pytest.mark.parametrize("groups, error, message", [
    ([{"params": [], "lr_scale": 2.0}], ValueError, r"unknown key 'lr_scale' \(params, lr, weight_decay\)"),
    ([{"lr": 2.0}], ValueError, "group 0 has no 'params'"),
    ([{"params": [], "lr": -1.0}], ValueError, "group 0's lr must be a finite number >= 0, got -1.0"),
    ([{"params": []}, {"params": [], "lr": float("nan")}], ValueError, "group 1's lr must be a finite .* got nan"),
    ([{"params": [], "lr": "fast"}], TypeError, "group 0's lr must be a number"),
    ([{"params": [], "weight_decay": -1.0}], ValueError, "group 0's weight_decay must be a finite number >= 0"),
    ([{"params": []}, []], TypeError, "group 1 is not a dict"),
    ([{"params": [1.0]}], TypeError, "group 0's params must be a list of tensors"),
    ([1.0], TypeError, "parameters must be a list of tensors"),
])
def test_adamw_group_errors(groups, error, message):
    with pytest.raises(error, match=message):
        relgrad.AdamW(groups)


@pytest.mark.parametrize("keywords, message", [
    (dict(lr=-0.1), "AdamW: lr must be a finite number >= 0, got -0.1"),
    (dict(lr=float("nan")), "AdamW: lr must be a finite number >= 0, got nan"),
    (dict(lr=float("inf")), "AdamW: lr must be a finite number >= 0, got inf"),
    (dict(weight_decay=-1.0), "AdamW: weight_decay must be a finite number >= 0"),
    (dict(betas=(0.9, 1.0)), "beta1, beta2 < 1"),
])
def test_adamw_bad_keywords(keywords, message):
    a = relgrad.tensor(np.ones(2), requires_grad=True)
    with pytest.raises(ValueError, match=message):
        relgrad.AdamW([a], **keywords)


@pytest.mark.parametrize("change, message", [
    (lambda groups: groups[1].update(lr=float("nan")), r"param_groups\[1\]\['lr'\] must be a finite .* got nan"),
    (lambda groups: groups[0].update(lr=-1), r"param_groups\[0\]\['lr'\] must be a finite .* got -1.0"),
    (lambda groups: groups[1].update(weight_decay=0.5), "params and weight_decay are fixed"),
    (lambda groups: groups[0]["params"].pop(), "params and weight_decay are fixed"),
    (lambda groups: groups.pop(), "param_groups has 1 groups, the optimizer was built with 2"),
])
def test_a_step_refuses_bad_param_groups_before_it_updates_anything(change, message):
    a = relgrad.tensor(np.ones(2), requires_grad=True)
    b = relgrad.tensor(np.ones(2), requires_grad=True)
    adam = relgrad.AdamW([{"params": [a]}, {"params": [b]}], lr=0.1)
    (a + b).sum().backward()
    change(adam.param_groups)
    with pytest.raises(ValueError, match=message):
        adam.step()
    assert adam.steps == 0 and a.numpy().tolist() == [1.0, 1.0] and b.numpy().tolist() == [1.0, 1.0]


def test_adamw_refuses_one_tensor_and_a_parameter_listed_twice():
    a = relgrad.tensor(np.ones((3, 2)), requires_grad=True)
    # one tensor alone would be taken as its rows, which never get a gradient
    with pytest.raises(TypeError, match="must be a list of tensors"):
        relgrad.AdamW(a)
    with pytest.raises(ValueError, match="a parameter is in groups 0 and 1"):
        relgrad.AdamW([{"params": [a]}, {"params": [a]}])
    with pytest.raises(ValueError, match="listed twice in group 0"):
        relgrad.AdamW([a, a])


def test_adamw_and_lr_scheduler_step_as_torchs_adamw_and_lambda_lr():
    # The independent check, in float64: torch.optim.AdamW (whose weight decay is decoupled as
    # relgrad's: p (1 - lr wd) - lr m_hat / (sqrt(v_hat) + eps)) under a LambdaLR whose factor is
    # the cosine schedule with warmup written out again, two groups, past the schedule's end.
    import math

    import torch
    rng = np.random.default_rng(0)
    x, y, w0, b0 = (rng.standard_normal(shape) for shape in [(6, 3), (6, 2), (3, 2), (2,)])
    warmup, total = 3, 10

    def factor(t):
        if t < warmup:
            return (t + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1, (t - warmup) / (total - warmup))))

    w, b = relgrad.tensor(w0, requires_grad=True), relgrad.tensor(b0, requires_grad=True)
    tw, tb = torch.tensor(w0, requires_grad=True), torch.tensor(b0, requires_grad=True)
    ours = relgrad.AdamW([{"params": [w], "lr": 0.05}, {"params": [b], "weight_decay": 0.0}], lr=0.02,
                         betas=(0.9, 0.98), weight_decay=0.1)
    theirs = torch.optim.AdamW([{"params": [tw], "lr": 0.05}, {"params": [tb], "weight_decay": 0.0}], lr=0.02,
                               betas=(0.9, 0.98), weight_decay=0.1)
    our_schedule = relgrad.LRScheduler(ours, "cosine", warmup_steps=warmup, total_steps=total)
    their_schedule = torch.optim.lr_scheduler.LambdaLR(theirs, factor)
    for _ in range(total + 2):
        np.testing.assert_allclose(our_schedule.get_last_lr(), their_schedule.get_last_lr(), rtol=1e-15, atol=0)
        w.zero_grad()
        b.zero_grad()
        ((relgrad.tensor(x) @ w + b - relgrad.tensor(y)) ** 2).mean().backward()
        ours.step()
        our_schedule.step()
        theirs.zero_grad()
        ((torch.tensor(x) @ tw + tb - torch.tensor(y)) ** 2).mean().backward()
        theirs.step()
        their_schedule.step()
        np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=0, atol=1e-12)
        np.testing.assert_allclose(b.numpy(), tb.detach().numpy(), rtol=0, atol=1e-12)
    assert our_schedule.get_last_lr() == [0.0, 0.0] and our_schedule.last_epoch == total + 2
    assert np.abs(w.numpy() - w0).max() > 0.1  # it trained
    assert [g["initial_lr"] for g in ours.param_groups] == our_schedule.base_lrs == [0.05, 0.02]


@pytest.mark.parametrize("schedule", relgrad.LRScheduler.schedules)
def test_lr_scheduler_gives_the_trainers_learning_rates_exactly(tmp_path, schedule):
    steps, warmup, peak = 12, 4, 3e-3
    relgrad.train(out=str(tmp_path), set=[
        "task.train_examples=40", "task.test_examples=8", "model.layers=1", "model.dim=8", "model.ff_dim=16",
        "model.heads=1", f"training.steps={steps}", f"training.warmup_steps={warmup}",
        f"training.learning_rate={peak}", f"training.schedule={schedule}", "training.log_every=1",
        f"evaluation.every={steps}"])
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    trainers = [line["learning_rate"] for line in lines if "learning_rate" in line]
    scheduler = relgrad.LRScheduler(relgrad.AdamW([relgrad.zeros(1)], lr=peak), schedule, warmup_steps=warmup,
                                    total_steps=steps)
    ours = []
    for _ in range(steps):
        ours += scheduler.get_last_lr()
        scheduler.step()
    assert len(trainers) == steps and ours == trainers  # bit for bit


def test_lr_scheduler_names_and_errors():
    assert relgrad.LRScheduler.schedules == ("constant", "linear", "cosine")  # engine/optim.hpp's schedule_names
    adam = relgrad.AdamW([relgrad.zeros(1)], lr=0.1)
    constant = relgrad.LRScheduler(adam, "constant", warmup_steps=2)  # needs no total_steps
    assert constant.get_last_lr() == [0.05] == [adam.param_groups[0]["lr"]]
    for keywords, message in [
        (dict(schedule="step"), r"unknown schedule 'step' \(expected constant, linear or cosine\)"),
        (dict(schedule="cosine"), "the cosine schedule needs total_steps"),
        (dict(schedule="linear", total_steps=0), "total_steps must be >= 1, got 0"),
        (dict(schedule="constant", warmup_steps=-1), "warmup_steps must be >= 0, got -1"),
    ]:
        with pytest.raises(ValueError, match=message):
            relgrad.LRScheduler(adam, **keywords)


def test_clip_grad_norm():
    def parameters():
        a = relgrad.tensor(np.array([[3.0, 0.0], [0.0, 0.0]]), requires_grad=True)
        b = relgrad.tensor(np.array([4.0]), requires_grad=True)
        ((a * a).sum() * 0.5 + (b * b).sum() * 0.5).backward()  # gradients a and b: norm 5 together
        return a, b

    a, b = parameters()
    assert relgrad.clip_grad_norm([a, b], 1.0) == pytest.approx(5.0)
    np.testing.assert_allclose(a.grad.numpy(), [[0.6, 0.0], [0.0, 0.0]], rtol=1e-6)
    np.testing.assert_allclose(b.grad.numpy(), [0.8], rtol=1e-6)
    a, b = parameters()
    assert relgrad.clip_grad_norm((p for p in (a, b)), 10.0) == pytest.approx(5.0)  # any iterable; below: kept
    np.testing.assert_allclose(b.grad.numpy(), [4.0])
    a, b = parameters()
    assert relgrad.clip_grad_norm(a, 1.0) == pytest.approx(3.0)  # one tensor: a list of one, as PyTorch
    np.testing.assert_allclose(a.grad.numpy(), [[1.0, 0.0], [0.0, 0.0]], rtol=1e-6)
    with pytest.raises(TypeError, match="clip_grad_norm: parameters must be a list of tensors"):
        relgrad.clip_grad_norm([a, 1.0], 1.0)


def test_masks():
    padding = nn.key_padding_mask([2, 3])
    assert padding.shape == (2, 1, 1, 3)
    np.testing.assert_array_equal(padding.numpy()[:, 0, 0], [[True, True, False], [True, True, True]])
    np.testing.assert_array_equal(nn.causal_mask(3).numpy(), np.tril(np.ones((3, 3), bool)))
    window = nn.local_window_mask(4, window=1).numpy()
    np.testing.assert_array_equal(window, np.abs(np.arange(4)[None] - np.arange(4)[:, None]) <= 1)
    both = nn.combine_masks(nn.causal_mask(4), nn.local_window_mask(4, window=1)).numpy()
    np.testing.assert_array_equal(both, np.tril(window))
    assert nn.combine_masks(None, None) is None
    np.testing.assert_array_equal(nn.pattern_mask(4, 4, causal=True).numpy(), np.tril(np.ones((4, 4), bool)))


def test_attention_layers_and_weights():
    x = relgrad.randn(2, 5, 8, seed=2)
    mha = nn.MultiHeadAttention(8, 2, seed=1)
    mask = nn.key_padding_mask([5, 3])
    assert mha(x, mask=mask).shape == (2, 5, 8)
    weights = mha.last_weights.numpy()
    np.testing.assert_allclose(weights.sum(-1), 1, rtol=1e-6)
    assert (weights[1, :, :, 3:] == 0).all()
    mha.causal = True
    mha(x)
    assert (np.triu(mha.last_weights.numpy()[0, 0], 1) == 0).all()
    gated = nn.GatedPositionAttention(8, 2, k=2, seed=1)
    assert gated(x).shape == (2, 5, 8) and gated.gate_values() == [0.5, 0.5]
    assert gated.w_gate is None and nn.GatedPositionAttention(8, 2, token_gate=True).w_gate is not None


@pytest.mark.parametrize(
    "make, query_offset",
    [
        (lambda impl: nn.RelativeMultiHeadAttention(8, 2, k=2, attention=impl, seed=5, dtype="float64"), 0),
        (lambda impl: nn.RotaryMultiHeadAttention(8, 2, rope_base=100.0, attention=impl, seed=5, dtype="float64"), 4),
        (lambda impl: nn.AlibiAttention(8, 2, attention=impl, seed=5, dtype="float64"), 4),
        (lambda impl: nn.T5BiasAttention(8, 2, t5_buckets=8, t5_max_distance=5, attention=impl, seed=5,
                                         dtype="float64"), 4),
        (lambda impl: nn.T5BiasAttention(8, 2, bidirectional=False, attention=impl, seed=5, dtype="float64"), 4),
    ],
    ids=["shaw", "rope", "alibi", "t5", "t5_causal"],
)
def test_the_three_attention_forms_agree_in_float64(make, query_offset):
    # queries from position query_offset on, attending to every key (padding masked)
    x_values = np.random.default_rng(1).standard_normal((2, 7, 8))
    outputs, grads = [], []
    for impl in ("reference", "bucketed", "fused"):
        layer = make(impl)
        assert layer.impl == impl
        x = relgrad.tensor(x_values, requires_grad=True)
        out = layer(x[:, query_offset:], x, mask=nn.key_padding_mask([7, 5]), query_offset=query_offset)
        (out * out).sum().backward()
        outputs.append(out.numpy())
        grads.append([x.grad.numpy()] + [p.grad.numpy() for p in layer.parameters()])
    for other, other_grads in zip(outputs[1:], grads[1:]):
        np.testing.assert_allclose(other, outputs[0], atol=1e-12)
        for a, b in zip(other_grads, grads[0]):
            np.testing.assert_allclose(a, b, atol=1e-12)


def test_the_relative_family_functions():
    assert nn.alibi_slopes(6) == [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8]
    assert [nn.t5_bucket(r) for r in (-20, -7, 0, 1, 500)] == [10, 7, 0, 17, 31]
    assert nn.t5_bucket(5, bidirectional=False) == 0
    x = np.random.default_rng(2).standard_normal((3, 4))
    y = relgrad.rope(relgrad.tensor(x), first_position=2, base=100.0).numpy()
    for p in range(3):
        for t in range(2):
            angle = (2 + p) * 100.0 ** (-2 * t / 4)
            c, s = np.cos(angle), np.sin(angle)
            np.testing.assert_allclose(y[p, 2 * t], x[p, 2 * t] * c - x[p, 2 * t + 1] * s, atol=1e-14)
            np.testing.assert_allclose(y[p, 2 * t + 1], x[p, 2 * t] * s + x[p, 2 * t + 1] * c, atol=1e-14)


def test_the_relative_family_options():
    assert nn.AlibiAttention(8, 4).slopes == [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8]
    t5 = nn.T5BiasAttention(8, 2, t5_buckets=16)
    assert t5.num_buckets == 16 and t5.bidirectional and t5.relative_attention_bias.weight.shape == (16, 2)
    with pytest.raises(TypeError, match="rope_base"):
        nn.AlibiAttention(8, 2, rope_base=3.0)
    with pytest.raises(ValueError, match="t5_max_distance"):
        nn.T5BiasAttention(8, 2, t5_buckets=16, t5_max_distance=8)
    with pytest.raises(ValueError, match="even"):
        nn.RotaryMultiHeadAttention(6, 2)


@pytest.mark.parametrize("position", ["none", "sinusoidal", "learned", "relative", "gated", "rope", "alibi", "t5"])
def test_models_forward_and_decode(position):
    ids = relgrad.tensor([[4, 5, 6, 7], [5, 6, 0, 0]])
    classifier = nn.SequenceClassifier(10, 3, position=position, **MODEL)
    assert classifier(ids, lengths=[4, 2]).shape == (2, 3)
    language_model = nn.CausalLanguageModel(10, position=position, **MODEL)
    assert language_model(ids).shape == (2, 4, 10)
    continuation = language_model.eval().greedy_decode([4, 5], eos=2, max_tokens=5)
    assert len(continuation) <= 5 and all(0 <= t < 10 for t in continuation)
    translator = nn.EncoderDecoder(10, 12, position=position, **MODEL)
    assert translator(ids, ids, source_lengths=[4, 2], target_lengths=[4, 2]).shape == (2, 4, 12)
    decoded = translator.eval().greedy_decode(ids, bos=1, eos=2, max_steps=4, source_lengths=[4, 2])
    assert len(decoded) == 2 and all(len(row) <= 4 for row in decoded)
    gates = classifier.gates()
    assert (len(gates) == 1 and len(gates[0]) == 2) if position == "gated" else gates == []


def test_state_dict_round_trip():
    a = nn.SequenceClassifier(10, 2, position="relative", **MODEL)
    b = nn.SequenceClassifier(10, 2, position="relative", **dict(MODEL, seed=4))
    ids = relgrad.tensor([[4, 5, 6]])
    assert not np.allclose(a(ids).numpy(), b(ids).numpy())
    state = a.state_dict()
    assert list(state) == [name for name, _ in a.named_parameters()]
    assert "encoder.layers.0.self_attention.rel_pos_emb_k.weight" in state
    assert all(isinstance(v, np.ndarray) for v in state.values())
    b.load_state_dict(state)
    np.testing.assert_array_equal(a(ids).numpy(), b(ids).numpy())
    state["classifier.bias"][:] = 100  # a copy: the model is not changed through it
    assert a.classifier.bias.numpy().max() < 100


def test_load_state_dict_refuses_and_changes_nothing():
    model = nn.Linear(3, 2, seed=1)
    before = model.state_dict()
    with pytest.raises(ValueError, match="missing bias"):
        model.load_state_dict({"weight": np.zeros((2, 3))})
    with pytest.raises(ValueError, match="unexpected extra"):
        model.load_state_dict(dict(before, extra=np.zeros(1)))
    with pytest.raises(ValueError, match="weight has shape \\[3, 2\\], the parameter \\[2, 3\\]"):
        model.load_state_dict({"weight": np.zeros((3, 2)), "bias": np.zeros(2)})
    with pytest.raises(ValueError, match="relgrad dtype"):
        model.load_state_dict({"weight": np.full((2, 3), "text"), "bias": np.zeros(2)})
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(value, before[name])


def test_modes_dtypes_and_devices():
    model = nn.EncoderLayer(**{key: value for key, value in MODEL.items() if key != "layers"})  # a block
    assert model.training and not model.eval().training and model.train().training
    x = relgrad.randn(1, 4, 8, seed=1)
    expected = model(x).numpy()
    model.to("guarded_cpu")
    assert model.device == "guarded_cpu"
    on_device = model(x.to("guarded_cpu"))
    with pytest.raises(ValueError, match="cannot read"):
        on_device.numpy()
    np.testing.assert_allclose(on_device.to("cpu").numpy(), expected, rtol=1e-6)
    model.to("cpu").to("float64")
    assert all(p.dtype == relgrad.float64 for p in model.parameters())


def test_child_layers_keep_their_parent_alive():
    fc1 = nn.FeedForward(4, 8, seed=1).fc1
    layers = nn.Encoder(**MODEL).layers
    gc.collect()
    assert fc1(relgrad.ones(1, 4)).shape == (1, 8)
    assert isinstance(layers[0].self_attention, nn.RelativeMultiHeadAttention)  # the most derived type
    assert layers[0](relgrad.ones(1, 3, 8)).shape == (1, 3, 8)


@pytest.mark.parametrize("build, error, message", [
    (lambda: nn.Linear(3, 2, sede=1), TypeError, "unexpected keyword argument 'sede'"),
    (lambda: nn.SequenceClassifier(10, 2, position="kerple"), ValueError, "kerple"),
    (lambda: nn.SequenceClassifier(10, 2, pooling="max"), ValueError, "pooling"),
    (lambda: nn.RelativeMultiHeadAttention(8, 2, attention="flash"), ValueError, "flash"),
    (lambda: nn.MultiHeadAttention(8, 3), ValueError, "heads"),
    (lambda: nn.Encoder(position="gated", attention="fused"), ValueError, "no fused form"),
    (lambda: nn.EncoderLayer(layers=2), TypeError, "unexpected keyword argument 'layers'"),  # one block
    (lambda: nn.Linear(3, 2)(relgrad.ones(2, 4)), ValueError, "input of shape \\[2, 4\\] must end in dim 3"),
    (lambda: nn.SequenceClassifier(10, 2, **MODEL)(relgrad.tensor([[4, 5]]), lengths=[3]), ValueError, "length"),
    (lambda: nn.Linear(3, 2).to("tpu"), ValueError, "tpu"),
    (lambda: nn.Linear(-1, 2), ValueError, "in_features must be positive, got -1"),
    (lambda: nn.Dropout(2.0), ValueError, "p must be in"),
    (lambda: nn.SinusoidalPositionalEncoding(4).encoding(-1), ValueError, "length must be >= 0, got -1"),
    (lambda: nn.LearnedPositionalEmbedding(2, 8)(relgrad.zeros(1, 5, 8)), ValueError, "exceeds max_positions 2"),
    (lambda: nn.CausalLanguageModel(10, **MODEL).greedy_decode([], eos=2, max_tokens=3), ValueError, "empty"),
    (lambda: nn.CausalLanguageModel(10, **MODEL).greedy_decode([4], eos=2, max_tokens=-1), ValueError,
     "max_tokens must be >= 0, got -1"),
    (lambda: nn.EncoderDecoder(10, 10, **MODEL).greedy_decode(relgrad.tensor([[4]]), bos=1, eos=2, max_steps=-1),
     ValueError, "max_steps must be >= 0, got -1"),
    (lambda: nn.SequenceClassifier(10, 2, **MODEL)(relgrad.tensor([[4.0, 5.0]])), ValueError, "must be int64"),
    (lambda: nn.key_padding_mask([-1]), ValueError, "outside"),
    (lambda: nn.causal_mask(-1), ValueError, "negative size"),
])
def test_errors(build, error, message):
    with pytest.raises(error, match=message):
        build()
