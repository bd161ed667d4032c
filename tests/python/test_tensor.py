"""relgrad.Tensor from Python: NumPy in and out, lifetimes, operators, indexing, autograd, errors,
and gradients of composed expressions against PyTorch. One file: everything
relgrad.Tensor does from Python (tests/python/ has one file per part of the module: Tensor, nn,
options, runs, scripts)."""
import gc
import sys
import threading
import time

import numpy as np
import pytest
import torch

import relgrad


# --- NumPy in and out


@pytest.mark.parametrize("numpy_dtype, expected", [
    ("float16", relgrad.float16), ("float32", relgrad.float32), ("float64", relgrad.float64),
    ("int8", relgrad.int64), ("int16", relgrad.int64), ("int32", relgrad.int64), ("int64", relgrad.int64),
    ("uint8", relgrad.int64), ("uint16", relgrad.int64), ("uint32", relgrad.int64), ("uint64", relgrad.int64),
    ("bool", relgrad.bool),
])
def test_dtype_round_trip(numpy_dtype, expected):
    values = (np.arange(12).reshape(3, 4) % 7).astype(numpy_dtype)
    t = relgrad.tensor(values)
    assert t.dtype == expected
    assert t.shape == (3, 4)
    back = t.numpy()
    assert back.dtype == np.dtype(str(expected))
    np.testing.assert_array_equal(back, values.astype(back.dtype))


def test_16_bit_dtypes_round_as_torch_does():
    rng = np.random.default_rng(3)
    values = np.concatenate([rng.standard_normal(4000), rng.standard_normal(4000) * 1e4,
                             [65504.0, 65520.0, 1e5, 2.0 ** -24, 2.0 ** -25, 0.1, -0.0]]).astype(np.float32)
    for name, torch_dtype in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        t = relgrad.tensor(values, dtype=name)
        assert t.dtype == getattr(relgrad, name) and str(t.dtype) == name
        expected = torch.tensor(values).to(torch_dtype).float().numpy()
        np.testing.assert_array_equal(t.to("float32").numpy(), expected)


def test_float16_numpy_shares_memory_and_bfloat16_refuses():
    t = relgrad.tensor(np.array([1.5, -2.0, 0.25], dtype=np.float16))
    view = t.numpy()
    assert view.dtype == np.float16
    view[0] = 3.0
    assert t.tolist() == [3.0, -2.0, 0.25]
    b = t.to("bfloat16")
    with pytest.raises(ValueError, match="NumPy has no bfloat16"):
        b.numpy()
    assert b.tolist() == [3.0, -2.0, 0.25]
    assert "dtype=bfloat16" in repr(b)
    assert np.asarray(b).dtype == np.float32  # a copy, float32 holding the values exactly



def test_python_values_follow_torch_defaults():
    assert relgrad.tensor([1.5, 2.0]).dtype == relgrad.float32
    assert relgrad.tensor([[1, 2], [3, 4]]).dtype == relgrad.int64
    assert relgrad.tensor([True, False]).dtype == relgrad.bool
    assert relgrad.tensor(3.0).shape == ()
    assert relgrad.tensor(np.zeros(2)).dtype == relgrad.float64  # an array keeps its dtype


def test_single_elements_as_python_values():
    assert float(relgrad.tensor([2.5])) == 2.5 and relgrad.tensor(2.5).item() == 2.5
    assert bool(relgrad.tensor(1.0)) and not bool(relgrad.zeros(1, 1))
    with pytest.raises(ValueError, match="2 elements is ambiguous"):
        bool(relgrad.ones(2))


def test_explicit_dtype_converts():
    t = relgrad.tensor(np.arange(4.0), dtype="int64")
    assert t.dtype == relgrad.int64 and t.numpy().tolist() == [0, 1, 2, 3]
    assert relgrad.tensor([1, 2], dtype=relgrad.float64).dtype == relgrad.float64
    assert relgrad.tensor([1, 2], dtype=np.float32).dtype == relgrad.float32
    assert t.to("float32").dtype == relgrad.float32


def test_sizes_past_int64_and_past_memory_are_named():
    with pytest.raises(ValueError, match=r"size 18446744073709551616 does not fit int64 \(sizes are at most 2\^63 - 1\)"):
        relgrad.zeros(2**64)
    with pytest.raises(ValueError, match="size -18446744073709551616 does not fit int64"):
        relgrad.ones(3).view(-2**64)
    with pytest.raises(MemoryError, match=r"^cannot allocate 128.0 TiB on the cpu for a \[35184372088832\] float32 tensor$"):
        relgrad.zeros(2**45)
    with pytest.raises(MemoryError, match=r"^cannot allocate 8.0 PiB on the cpu for a \[1073741824, 1048576\] float32 tensor$"):
        relgrad.nn.Linear(2**20, 2**30)  # its initial values, drawn on the host (a double each)
    with pytest.raises(ValueError, match=r"shape \[576460752303423488, 4\] has too many elements"):
        relgrad.zeros(2**59, 4, dtype="float64")
    with pytest.raises(TypeError, match="a shape is an int or a sequence of ints, got float"):
        relgrad.zeros(2.5)
    with pytest.raises(TypeError, match="a size is an int, got str"):
        relgrad.zeros((2, "3"))


@pytest.mark.parametrize("data, dtype, message", [
    (np.array([0.5]), "int64", "fractional"),
    (np.array([1 + 2j]), None, "complex128"),
    (np.array(["a"]), None, "relgrad dtype"),
    ([1.0], "float8", "unknown dtype"),
    ([1.0], 3, "a dtype is a relgrad.dtype or its name"),
    (np.array([5, 2**64 - 1], dtype=np.uint64), None, r"18446744073709551615 does not fit int64, .*2\^63 - 1"),
    ([2**63], "int64", r"9223372036854775808 does not fit int64"),
])
def test_tensor_refuses_what_it_cannot_hold(data, dtype, message):
    with pytest.raises(ValueError, match=message):
        relgrad.tensor(data, dtype=dtype)


def test_numpy_shares_memory_without_copy():
    t = relgrad.zeros(2, 3)
    array = t.numpy()
    assert np.shares_memory(array, t.numpy())
    array[1, 2] = 7.0
    assert t[1, 2].item() == 7.0
    view = t.transpose(0, 1)
    assert view.numpy()[2, 1] == 7.0 and not view.is_contiguous()
    assert np.shares_memory(view.numpy(), array)


def test_numpy_is_read_only_where_writing_would_bypass_autograd():
    leaf = relgrad.ones(3, requires_grad=True)
    assert not leaf.numpy().flags.writeable
    broadcast = relgrad.ones(1, 3).expand(4, 3)
    assert not broadcast.numpy().flags.writeable
    assert relgrad.ones(3).numpy().flags.writeable


def test_backward_refuses_a_saved_tensor_written_through_numpy_after_the_forward():
    w = relgrad.ones(3, requires_grad=True)
    x = relgrad.tensor([1.0, 2.0, 3.0])
    before = x.numpy()  # handed out before the graph saved x: writable
    y = (w * x).sum()
    during = x.numpy()  # while mul keeps x for its backward: read-only
    assert before.flags.writeable and not during.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        during[:] = 5
    before[:] = [1.0, 2.0, 3.0]  # the same values: nothing the gradient reads changed
    y.backward(retain_graph=True)
    np.testing.assert_array_equal(w.grad.numpy(), [1, 2, 3])
    before[:] = 5
    with pytest.raises(RuntimeError, match=r"backward of mul: b \(\[3\], float32\), which mul saved for its "
                                           r"gradient, was changed in place through a NumPy array"):
        y.backward()
    np.testing.assert_array_equal(w.grad.numpy(), [1, 2, 3])  # the refused pass added nothing
    del y
    gc.collect()
    assert x.numpy().flags.writeable  # no graph keeps x any more


def test_backward_refuses_a_saved_tensor_changed_by_a_step_or_through_from_numpy():
    w = relgrad.ones(3, requires_grad=True)
    y = (w * relgrad.tensor([1.0, 2.0, 3.0])).sum()
    y.backward(retain_graph=True)
    relgrad.AdamW([w], lr=0.1).step()  # writes w, which mul saved
    with pytest.raises(RuntimeError, match=r"backward of mul: a .* in place \(copy_, an optimizer step or a load\)"):
        y.backward()
    w = relgrad.ones(3, requires_grad=True)
    array = np.ones(3, dtype=np.float32)
    shared = relgrad.from_numpy(array)
    y = (w * shared).sum()
    array[0] = 7
    with pytest.raises(RuntimeError, match="backward of mul: b .* through a NumPy array sharing its memory"):
        y.backward()
    y = (w + shared).sum()  # add reads no values in its backward: nothing to refuse
    array[1] = 7
    y.backward()
    np.testing.assert_array_equal(w.grad.numpy(), [1, 1, 1])


def test_array_outlives_its_tensor():
    t = relgrad.randn(64, 64, seed=3)
    expected = t.numpy().copy()
    array = t.numpy()
    del t
    gc.collect()
    churn = [relgrad.full((64, 64), 9.0) for _ in range(50)]  # would reuse freed memory
    np.testing.assert_array_equal(array, expected)
    assert len(churn) == 50


def test_tensor_outlives_its_array():
    source = np.arange(4096, dtype=np.float64)
    t = relgrad.tensor(source)
    del source
    gc.collect()
    churn = [np.full(4096, -1.0) for _ in range(50)]
    np.testing.assert_array_equal(t.numpy(), np.arange(4096, dtype=np.float64))
    assert len(churn) == 50


@pytest.mark.parametrize("numpy_dtype", ["float16", "float32", "float64", "int64", "bool"])
def test_from_numpy_shares_the_arrays_memory(numpy_dtype):
    array = (np.arange(24).reshape(4, 6) % 5).astype(numpy_dtype)
    strided = array[::2, 1::2]  # a view with strides of its own
    t = relgrad.from_numpy(strided)
    assert t.dtype == getattr(relgrad, "bool" if numpy_dtype == "bool" else numpy_dtype)
    assert t.shape == (2, 3) and t.strides == (12, 2)
    assert np.shares_memory(t.numpy(), array)
    strided[1, 2] = 1
    assert t[1, 2].item() == 1


def test_from_numpy_parameter_steps_in_the_array():
    array = np.array([[1.0, -2.0], [3.0, 0.5]], dtype=np.float32)
    weight = relgrad.from_numpy(array[:, 1])  # a column: stride 2
    weight.requires_grad = True
    (weight * weight).sum().backward()
    relgrad.AdamW([weight], lr=0.1, weight_decay=0.0).step()  # each element moves by lr against its gradient's sign
    np.testing.assert_allclose(array, [[1.0, -1.9], [3.0, 0.4]], rtol=1e-6)


def test_from_numpy_keeps_the_array_alive_and_computes():
    t = relgrad.from_numpy(np.full((128, 128), 0.5, dtype=np.float16))
    gc.collect()
    churn = [np.full((128, 128), -1.0, dtype=np.float16) for _ in range(50)]
    y = (t * 2).sum()
    assert y.dtype == relgrad.float16 and y.item() == 128 * 128
    assert len(churn) == 50


@pytest.mark.parametrize("array, message", [
    (np.arange(4, dtype=np.int32), "NumPy dtype int32 has no relgrad dtype of the same bytes"),
    (np.arange(4, dtype=">f4"), "big-endian"),
    (np.arange(4.0)[::-1], "dim 0 has a stride of -8 bytes"),
    (np.broadcast_to(np.arange(3.0), (4, 3)), "read-only"),
    (np.lib.stride_tricks.as_strided(np.arange(3.0), (4, 3), (0, 8)), "dim 0 has a stride of 0 bytes"),
    (np.frombuffer(bytearray(40), dtype=np.float64, offset=1, count=4), "not aligned"),
])
def test_from_numpy_refuses_what_it_cannot_share(array, message):
    """Each refusal says what relgrad.tensor(a), a copy, does instead."""
    with pytest.raises(ValueError, match=message):
        relgrad.from_numpy(array)


def test_guarded_device_refuses_host_access():
    t = relgrad.ones(2, 2, device="guarded_cpu")
    assert t.device == "guarded_cpu"
    with pytest.raises(ValueError, match="cannot read"):
        t.numpy()
    np.testing.assert_array_equal((t + t).to("cpu").numpy(), np.full((2, 2), 2.0))


def test_cuda_device_runs_or_is_refused_for_cuda_s_own_reason():
    """The Python module opens the CUDA backend's module (librelgrad_cuda.so) as the program does:
    without a GPU the refusal gives CUDA's reason (or says the build has no CUDA), never that
    the module could not be found or loaded."""
    try:
        t = relgrad.ones(2, device="cuda")
    except RuntimeError as error:
        assert str(error).startswith("no usable CUDA device: ")
        assert "librelgrad_cuda" not in str(error) and "cannot load" not in str(error), str(error)
    else:
        np.testing.assert_array_equal(t.to("cpu").numpy(), [1.0, 1.0])



# --- operators and indexing against NumPy


def test_operators_match_numpy(rng):
    a_np, b_np = rng.uniform(0.5, 2, (3, 4)), rng.uniform(0.5, 2, (4,))
    a, b = relgrad.tensor(a_np), relgrad.tensor(b_np)
    cases = [(a + b, a_np + b_np), (a - b, a_np - b_np), (a * b, a_np * b_np), (a / b, a_np / b_np),
             (a ** b, a_np ** b_np), (a ** 2, a_np ** 2), (-a, -a_np), (2 + a, 2 + a_np), (2 - a, 2 - a_np),
             (3 * a, 3 * a_np), (1 / a, 1 / a_np), (2 ** a, 2 ** a_np), (a @ b, a_np @ b_np),
             (a @ a.T, a_np @ a_np.T)]
    for got, want in cases:
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)


def test_integer_tensor_refuses_fractional_number():
    with pytest.raises(ValueError, match="int64 tensor and the number 2.5"):
        relgrad.tensor([1, 2]) + 2.5
    with pytest.raises(ValueError, match=r"add: needs a floating tensor \(float32, float64, bfloat16 or float16\)"):
        relgrad.tensor([1, 2]) + 2  # the engine's arithmetic is floating-point


@pytest.mark.parametrize("key", [
    0, -1, slice(1, 3), slice(None, None, 2), (1, slice(None)), (Ellipsis, 2), (None, 0), (slice(0, 2), None, -1),
    (Ellipsis,), (1, 2, 3), slice(5, 9), (slice(1, None, 3), Ellipsis, None),
])
def test_indexing_matches_numpy(key):
    values = np.arange(4 * 3 * 5.0).reshape(4, 3, 5)
    got = relgrad.tensor(values)[key]
    np.testing.assert_array_equal(got.numpy(), values[key])


@pytest.mark.parametrize("key, error", [
    (4, IndexError), (-5, IndexError), ((0, 0, 0, 0), IndexError), (slice(None, None, -1), ValueError),
    (relgrad.tensor([0]), IndexError), ((Ellipsis, Ellipsis), IndexError), (True, IndexError), ((0, False), IndexError),
])
def test_indexing_errors(key, error):
    with pytest.raises(error):
        relgrad.zeros(4, 3, 5)[key]


def test_indexing_is_differentiable():
    x = relgrad.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    (x[1, 1:] * 2).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[0, 0, 0], [0, 2, 2]])


# --- autograd


def test_grad_fn_is_walkable():
    a = relgrad.tensor([1.0, 2.0], requires_grad=True)
    b = relgrad.tensor([3.0, 4.0], requires_grad=True)
    y = a * b + a
    assert a.grad_fn is None and a.is_leaf
    assert y.grad_fn.name == "add"
    product, again = y.grad_fn.inputs
    assert product.grad_fn.name == "mul" and again._id == a._id
    assert [t._id for t in product.grad_fn.inputs] == [a._id, b._id]
    order = relgrad.topological_order(y)
    assert order[-1]._id == y._id and {t._id for t in order[:2]} == {a._id, b._id}
    # one chain-rule step by hand: d(a*b)/da = b
    grads = product.grad_fn.backward(relgrad.ones(2))
    np.testing.assert_array_equal(grads[0].numpy(), [3.0, 4.0])
    assert product.grad_fn.output_shape == (2,)
    with pytest.raises(ValueError, match=r"mul made a tensor of shape \[2\] \(float32, cpu\); grad_output is \[3\]"):
        product.grad_fn.backward(relgrad.ones(3))
    with pytest.raises(ValueError, match=r"grad_output is \[2\] \(float64, cpu\)"):
        product.grad_fn.backward(relgrad.ones(2, dtype="float64"))
    y.sum().backward()
    assert y.grad_fn.released and y.grad_fn.inputs == []
    np.testing.assert_array_equal(a.grad.numpy(), [4.0, 5.0])


def test_no_grad_restores_recording_even_after_an_error():
    x = relgrad.ones(2, requires_grad=True)
    with relgrad.no_grad():
        assert not relgrad.is_grad_enabled()
        assert not (x * 2).requires_grad
    assert relgrad.is_grad_enabled()
    with pytest.raises(ZeroDivisionError):
        with relgrad.no_grad():
            1 / 0
    assert relgrad.is_grad_enabled() and (x * 2).requires_grad


def test_detach_and_requires_grad():
    x = relgrad.ones(2, requires_grad=True)
    assert not x.detach().requires_grad
    y = x * 2
    with pytest.raises(ValueError, match="only a leaf"):
        y.requires_grad = False
    with pytest.raises(ValueError, match="cannot require a gradient"):
        relgrad.tensor([1, 2]).requires_grad_()


@pytest.mark.parametrize("action, error, message", [
    (lambda: relgrad.ones(2, 3) + relgrad.ones(4), ValueError, "broadcast"),
    (lambda: relgrad.ones(2, 3) @ relgrad.ones(2, 3), ValueError, "matmul"),
    (lambda: relgrad.ones(2, 3, requires_grad=True).backward(), ValueError, "single-element"),
    (lambda: relgrad.ones(2).backward(), ValueError, "does not require a gradient"),
    (lambda: relgrad.ones(6).view(4, 2), ValueError, "view"),
    (lambda: relgrad.ones(2).to("tpu"), ValueError, "tpu"),
    (lambda: relgrad.zeros(2, dtype="float8"), ValueError, "unknown dtype"),
    (lambda: relgrad.ones(2, 2).transpose(0, 5), ValueError, "dim"),
    (lambda: relgrad.ones(2, dtype="float32") + relgrad.ones(2, dtype="float64"), ValueError, "dtype"),
    (lambda: relgrad.softmax(relgrad.ones(2), 3), ValueError, "dim"),
    (lambda: relgrad.cross_entropy(relgrad.ones(2, 3), relgrad.tensor([0, 5])), ValueError, "target"),
    (lambda: relgrad.gather(relgrad.ones(2, 3), 1, relgrad.tensor([[0.5]])), ValueError, "int64"),
    (lambda: len(relgrad.tensor(1.0)), TypeError, "0-d"),
])
def test_engine_errors_raise_with_the_engine_message(action, error, message):
    with pytest.raises(error, match=message):
        action()


def test_backward_twice_needs_retain_graph():
    x = relgrad.ones(2, requires_grad=True)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [4.0, 4.0])
    with pytest.raises(RuntimeError, match="retain_graph"):
        y.backward()


# --- gradcheck


def test_gradcheck_reports_per_input_errors():
    a = relgrad.randn(3, 4, seed=1, dtype="float64").requires_grad_()
    b = relgrad.randn(4, seed=2, dtype="float64").requires_grad_()
    index = relgrad.tensor([[0, 2], [1, 3], [3, 3]])
    result = relgrad.gradcheck(lambda x, y, i: relgrad.gather(relgrad.tanh(x * y), 1, i).sum(), [a, b, index])
    assert result.passed and bool(result)
    assert len(result.per_input) == 3
    assert 0 < result.per_input[0].max_abs_error < 1e-7 and 0 < result.per_input[1].max_abs_error < 1e-7
    assert result.per_input[2].max_abs_error == 0  # not checked: an index
    assert result.max_abs_error == max(e.max_abs_error for e in result.per_input)


def test_gradcheck_catches_a_kink_and_refuses_float32():
    at_kink = relgrad.tensor([0.0, 1.0], dtype="float64", requires_grad=True)
    result = relgrad.gradcheck(lambda x: relgrad.relu(x).sum(), [at_kink])
    assert not result.passed and "input 0 element [0]" in result.report
    with pytest.raises(ValueError, match="float64"):
        relgrad.gradcheck(lambda x: x.sum(), [relgrad.ones(2, requires_grad=True)])
    with pytest.raises(TypeError, match="not a relgrad.Tensor"):
        relgrad.gradcheck(lambda x: 1.0, [at_kink])
    with pytest.raises(KeyError):  # an exception raised by fn comes through unchanged
        relgrad.gradcheck(lambda x: {}["missing"], [at_kink])
    for eps in (0.0, -1e-6, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"gradcheck: eps .*, expected a finite step > 0"):
            relgrad.gradcheck(lambda x: x.sum(), [at_kink], eps=eps)
    with pytest.raises(ValueError, match="expected finite numbers >= 0"):
        relgrad.gradcheck(lambda x: x.sum(), [at_kink], atol=-1.0)


# --- gradients of composed expressions against PyTorch


def against_torch(fn_relgrad, fn_torch, shapes, rng):
    values = [rng.standard_normal(shape) for shape in shapes]
    ours = [relgrad.tensor(v, requires_grad=True) for v in values]
    theirs = [torch.tensor(v, requires_grad=True) for v in values]
    out_ours, out_theirs = fn_relgrad(*ours), fn_torch(*theirs)
    np.testing.assert_allclose(out_ours.numpy(), out_theirs.detach().numpy(), rtol=1e-10, atol=1e-12)
    out_ours.backward()
    out_theirs.backward()
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_attention_like_expression_against_torch(rng):
    against_torch(lambda q, k, v: (relgrad.softmax(q @ k.transpose(0, 1) / 2.0, -1) @ v).tanh().sum(),
                  lambda q, k, v: torch.tanh(torch.softmax(q @ k.T / 2.0, -1) @ v).sum(),
                  [(4, 3), (5, 3), (5, 2)], rng)


def test_broadcast_and_normalisation_against_torch(rng):
    against_torch(lambda x, w, b: (relgrad.layer_norm(x, w, b) * x.sigmoid() + b).mean(),
                  lambda x, w, b: (torch.nn.functional.layer_norm(x, (4,), w, b) * torch.sigmoid(x) + b).mean(),
                  [(2, 3, 4), (4,), (4,)], rng)


def test_loss_expression_against_torch(rng):
    target = [2, 0, 1]
    against_torch(lambda x, w: relgrad.cross_entropy(relgrad.gelu(x @ w), relgrad.tensor(target)) ** 2.0,
                  lambda x, w: torch.nn.functional.cross_entropy(torch.nn.functional.gelu(x @ w),
                                                                 torch.tensor(target)) ** 2,
                  [(3, 5), (5, 4)], rng)


def test_used_twice_and_sliced_against_torch(rng):
    against_torch(lambda x: ((x[:, 1:] * x[:, :-1]).exp() + x.max(1, keepdim=True)).log().sum(),
                  lambda x: ((x[:, 1:] * x[:, :-1]).exp() + x.amax(1, keepdim=True)).log().sum(),
                  [(3, 4)], rng)


# --- the picture of the graph


def test_draw_names_every_op_and_shape():
    a = relgrad.tensor([[1.0, 2.0, 3.0]], requires_grad=True)
    b = relgrad.tensor([1.0, 2.0, 3.0], requires_grad=True)
    loss = ((a + b) * a).sum()
    graph = relgrad.draw(loss, values=True)
    for op in ("add", "mul", "sum"):
        assert f'label="{op}"' in graph.source
    assert "[1, 3] float32" in graph.source and "[3] float32" in graph.source
    assert "data [1., 2., 3.]" in graph.source
    assert graph.svg().lstrip().startswith("<?xml") and "<svg" in graph.svg()
    loss.backward(retain_graph=True)
    source = relgrad.draw(loss, grads=True).source
    assert "grad [3., 6., 9.]" in source and "grad [1., 2., 3.]" in source  # 2a + b and a
    with pytest.raises(TypeError):
        relgrad.draw(np.zeros(2))


def test_threads_change_nothing_but_speed():
    before = relgrad.threads()
    x = relgrad.randn(96, 96, seed=4, dtype="float64")
    try:
        relgrad.set_threads(1)
        assert relgrad.threads() == 1
        one = (x @ x).softmax(-1).numpy()
        relgrad.set_threads(3)
        assert relgrad.threads() == 3
        np.testing.assert_array_equal((x @ x).softmax(-1).numpy(), one)
        with pytest.raises(ValueError, match=r"must be in \[1, 1024\], got 0"):
            relgrad.set_threads(0)
        with pytest.raises(ValueError, match="got 100000"):
            relgrad.set_threads(100000)
    finally:
        relgrad.set_threads(before)


# --- the profiler


def test_profile_times_each_op_per_phase_and_stops_on_error():
    x = relgrad.randn(8, 6, seed=1, dtype="float64", requires_grad=True)
    w = relgrad.randn(6, 4, seed=2, dtype="float64", requires_grad=True)
    (x @ w).sum()  # outside any profile: not counted
    with relgrad.profile() as p:
        (x @ w).tanh().sum().backward()
    rows = {(r["op"], r["phase"]): r for r in p.rows}
    for op in ("matmul", "tanh", "sum"):
        assert rows[(op, "forward")]["calls"] == 1 and rows[(op, "backward")]["calls"] == 1
    assert rows[("matmul", "forward")]["gemm_flops"] == 2 * 8 * 6 * 4
    assert rows[("matmul", "backward")]["gemm_flops"] == 2 * (2 * 8 * 6 * 4)  # dx and dw
    assert rows[("tanh", "forward")]["gemm_flops"] == 0
    seconds = [r["seconds"] for r in p.rows]
    assert seconds == sorted(seconds, reverse=True) and 0 < sum(seconds) <= p.seconds
    assert "matmul" in str(p) and "backward" in p.table() and "GFLOP/s" in str(p)

    with pytest.raises(RuntimeError, match="profile"):
        with relgrad.profile():
            with relgrad.profile():  # one at a time
                pass
    with pytest.raises(ValueError):
        with relgrad.profile() as failed:
            x @ x  # [8, 6] @ [8, 6]: the error leaves the block, and its __exit__ stops the profile
    assert all(r["op"] != "sum" for r in failed.rows)
    with relgrad.profile() as again:  # so the next one starts
        x.sum()
    assert [(r["op"], r["phase"], r["calls"]) for r in again.rows] == [("sum", "forward", 1)]


# --- long calls release the GIL


def test_backward_releases_the_gil():
    # With a 30 s switch interval Python never takes the GIL from the main thread by itself: the
    # ticker runs during backward() only if backward() lets go of the GIL.
    x = relgrad.randn(512, 512, seed=0, requires_grad=True)
    loss = (x @ x @ x @ x).tanh().sum()
    ticks, started, go, done = [], threading.Event(), threading.Event(), threading.Event()

    def tick():
        started.set()
        go.wait()
        while not done.is_set():
            ticks.append(1)
            time.sleep(0.001)  # lets go of the GIL between ticks

    ticker = threading.Thread(target=tick)
    ticker.start()
    started.wait()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(30)
    try:
        go.set()
        before = len(ticks)
        loss.backward()
        during = len(ticks) - before
    finally:
        sys.setswitchinterval(interval)
        done.set()
        ticker.join()
    assert during > 0


def test_dropout_add_is_the_residual_plus_dropout_with_the_same_mask():
    rng = np.random.default_rng(3)
    residual = relgrad.tensor(rng.standard_normal((4, 6)), requires_grad=True)
    x = relgrad.tensor(rng.standard_normal((4, 6)), requires_grad=True)
    fused = relgrad.dropout_add(residual, x, 0.5, seed=11)
    apart = residual + relgrad.dropout(x, 0.5, seed=11)
    np.testing.assert_array_equal(fused.numpy(), apart.numpy())
    assert 0 < (fused.numpy() == residual.numpy()).sum() < fused.numel()  # some dropped, some kept
    fused.sum().backward()
    np.testing.assert_array_equal(residual.grad.numpy(), np.ones((4, 6)))
    np.testing.assert_array_equal(x.grad.numpy() != 0, fused.numpy() != residual.numpy())


def test_slice_is_the_view_that_indexing_with_a_step_gives():
    t = relgrad.tensor(np.arange(24.0).reshape(4, 6), requires_grad=True)
    view = t.slice(1, 1, 6, 2)
    np.testing.assert_array_equal(view.numpy(), t[:, 1:6:2].numpy())
    view.sum().backward()
    expected = np.zeros((4, 6))
    expected[:, 1:6:2] = 1
    np.testing.assert_array_equal(t.grad.numpy(), expected)


def test_numpy_memory_cannot_be_freed_under_a_tensor_that_shares_it():
    a = np.arange(10.0)
    t = relgrad.from_numpy(a)
    with pytest.raises(ValueError, match="cannot resize"):
        a.resize(2 * 10**6, refcheck=False)  # would free the buffer t reads
    np.testing.assert_array_equal(t.numpy(), np.arange(10.0))
    base = np.arange(12.0)
    over_a_view = relgrad.from_numpy(base[2:])
    with pytest.raises(ValueError, match="cannot resize"):
        base.resize(2 * 10**6, refcheck=False)  # the memory the view shares is base's
    np.testing.assert_array_equal(over_a_view.numpy(), np.arange(2.0, 12.0))
    del t, over_a_view
    gc.collect()
    a.resize(20, refcheck=False)  # free again once no tensor shares it
    base.resize(20, refcheck=False)


def test_from_numpy_shares_empty_arrays_of_any_shape():
    for shape in [(0,), (3, 0), (0, 4), (2, 0, 5)]:
        t = relgrad.from_numpy(np.zeros(shape, np.float32))
        assert tuple(t.shape) == shape and t.numel() == 0
