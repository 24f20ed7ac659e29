"""memfit.auto_batch_size calls the user's function again after an OOM: the
retry must start where the first call did, so that its training equals
plain training at the retried micro-batch from the same start."""

import copy
import gc

import pytest
import torch

import memfit
from memfit._native import tracked_live_bytes

pytestmark = pytest.mark.torch_api  # see python/tests/conftest.py

BUDGET = 8 << 20
WHOLE = 64


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(WHOLE, 64, generator=g), torch.randint(0, 10, (WHOLE,), generator=g)


def _one_step(model, opt, x, y, micro, steps):
    for i in range(steps):
        part = slice(i * micro, (i + 1) * micro)
        (torch.nn.functional.cross_entropy(model(x[part]), y[part]) / steps).backward()
    opt.step()
    opt.zero_grad(set_to_none=False)  # the gradients stay allocated, as many loops keep them


def test_a_retry_after_an_oom_trains_from_where_the_first_call_began():
    torch.manual_seed(0)
    gc.collect()
    left = tracked_live_bytes("cpu")
    x, y = _data()
    calls = []
    with memfit.simulated_device(BUDGET + left):
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 10))
        plain = copy.deepcopy(model)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)

        @memfit.auto_batch_size(WHOLE, model=model, inputs=x[:4], target=y[:4], optimizer=opt)
        def train(micro, steps):
            calls.append((micro, tracked_live_bytes("cpu") - left, len(opt.state)))
            _one_step(model, opt, x, y, micro, steps)
            if len(calls) == 1:  # the user's own extra, after a step: an OOM
                torch.empty(BUDGET, dtype=torch.uint8)
            _one_step(model, opt, x, y, micro, steps)
            return micro

        micro = train()
    (first, alive, state), (retried, alive_again, state_again) = calls
    assert (first, retried) == (WHOLE, micro) and micro < WHOLE
    assert (alive_again, state_again) == (alive, state) == (alive, 0)
    # The truth: two plain steps at the retried micro-batch from the same start.
    plain_opt = torch.optim.Adam(plain.parameters(), lr=1e-2)
    for _ in range(2):
        _one_step(plain, plain_opt, x, y, micro, WHOLE // micro)
    for p, q in zip(model.parameters(), plain.parameters()):
        assert torch.equal(p, q)


CUDNN = ("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in "
         "a non-contiguous input.")


@pytest.mark.parametrize("error, retried", [
    (RuntimeError(CUDNN), True),
    (RuntimeError("CUDA error: out of memory. CUDA kernel errors might be asynchronously "
                  "reported"), True),
    (RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 5x6)"), False),
])
def test_what_is_retried_at_a_smaller_batch_is_what_accelerate_retries(error, retried):
    accelerate_memory = pytest.importorskip("accelerate.utils.memory")
    assert accelerate_memory.should_reduce_batch_size(error) == retried  # the truth
    x, y = _data()
    model = torch.nn.Linear(64, 10)
    calls = []

    @memfit.auto_batch_size(8, model=model, inputs=x[:4], target=y[:4], optimizer="sgd",
                            budget="64MiB")
    def train(micro):
        calls.append(micro)
        if len(calls) == 1:
            raise error
        return micro

    if retried:
        assert train() == 4 and calls == [8, 4]
    else:
        with pytest.raises(RuntimeError) as e:
            train()
        assert e.value is error and calls == [8]


def test_accelerates_own_pattern_gets_the_batch_size_and_its_arguments():
    model = torch.nn.Linear(64, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def train(batch_size, model, optimizer):
        return batch_size, model, optimizer

    x, y = _data()
    ours = memfit.auto_batch_size(8, model=model, inputs=x[:4], target=y[:4], optimizer=opt,
                                  budget="64MiB")(train)
    assert ours(model, opt) == (8, model, opt)
    accelerate_memory = pytest.importorskip("accelerate.utils.memory")
    theirs = accelerate_memory.find_executable_batch_size(train, starting_batch_size=8)
    assert theirs(model, opt) == (8, model, opt)  # the truth


def test_when_every_batch_runs_out_the_model_and_optimizer_are_as_before_the_call():
    torch.manual_seed(0)
    gc.collect()
    left = tracked_live_bytes("cpu")
    x, y = _data()
    with memfit.simulated_device(BUDGET + left):
        model = torch.nn.Linear(64, 10)
        before = copy.deepcopy(model)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        alive = tracked_live_bytes("cpu")

        @memfit.auto_batch_size(4, model=model, inputs=x[:4], target=y[:4], optimizer=opt)
        def train(micro, steps):
            _one_step(model, opt, x, y, micro, steps)
            torch.empty(BUDGET, dtype=torch.uint8)

        with pytest.raises(torch.cuda.OutOfMemoryError, match=r"^\[auto_batch_size\] even a "):
            train()
        assert tracked_live_bytes("cpu") == alive and not opt.state
    for p, q in zip(model.parameters(), before.parameters()):
        assert p.grad is None and torch.equal(p, q)


def test_accelerates_accumulation_after_a_retry_steps_on_the_whole_batch():
    accelerate = pytest.importorskip("accelerate")
    acc = accelerate.Accelerator(cpu=True)
    torch.manual_seed(0)
    x, y = _data()
    model = torch.nn.Linear(64, 10)
    model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    calls = []

    @memfit.auto_batch_size(16, model=model, inputs=x[:4], target=y[:4], optimizer=opt,
                            budget="64MiB", accelerator=acc)
    def train(micro, steps):
        calls.append(micro)
        taken, samples = [], 0
        for i in range(0, WHOLE, micro):
            with acc.accumulate(model):
                acc.backward(torch.nn.functional.cross_entropy(model(x[i:i + micro]),
                                                               y[i:i + micro]))
            samples += micro
            if acc.sync_gradients:  # where accelerate steps the optimizer
                taken.append(samples)
                samples = 0
            if len(calls) == 1:  # the first call's first micro-batch: an OOM
                raise torch.cuda.OutOfMemoryError("CUDA out of memory.")
        return taken

    try:
        assert train() == [16] * (WHOLE // 16) and calls == [16, 8]
    finally:
        acc.gradient_accumulation_steps = 1  # the accelerator's state is the process's


def test_without_host_memory_for_the_copies_a_retry_drops_the_gradients_and_warns(
        monkeypatch):
    monkeypatch.setattr(memfit.plan.fit, "_host_bytes_free", lambda: 0)
    x, y = _data()
    model = torch.nn.Linear(64, 10)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    grads = []

    @memfit.auto_batch_size(8, model=model, inputs=x[:4], target=y[:4], optimizer=opt,
                            budget="64MiB")
    def train(micro, steps):
        grads.append([p.grad is None for p in model.parameters()])
        _one_step(model, opt, x, y, micro, steps)  # leaves zeroed gradients allocated
        if len(grads) == 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory.")
        return micro

    with pytest.warns(UserWarning, match=r"^\[auto_batch_size\] the retry goes on from the "):
        assert train() == 4
    assert grads == [[True, True], [True, True]]
