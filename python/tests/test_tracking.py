import gc

import pytest
import torch

import memfit

pytestmark = pytest.mark.torch_api  # see python/tests/conftest.py

MiB = 1 << 20


def test_float_tensor_of_a_million_is_four_million_bytes_then_zero():
    with memfit.track() as t:
        x = torch.empty(1000, 1000)
        assert t.live_bytes == 4_000_000
        del x
        assert t.live_bytes == 0
    assert t.peak_bytes == 4_000_000


def test_meta_tensor_counts_real_size_without_memory():
    # Counted from what is tracked already: tensors earlier tests keep
    # (caches, module-level models, reference cycles) stay tracked.
    gc.collect()
    live = memfit._memfit.tracked_live_bytes
    meta0, cpu0 = live("meta"), live("cpu")
    with memfit.track() as t:
        x = torch.empty(10**9, device="meta")
        assert t.live_bytes == 4 * 10**9
        assert live("meta") - meta0 == 4 * 10**9
        assert live("cpu") - cpu0 == 0
        del x


def test_budget_lets_9_mib_through_and_raises_at_2_more():
    with memfit.simulated_device("10MiB"):
        a = torch.empty(9 * MiB, dtype=torch.uint8)
        with pytest.raises(torch.cuda.OutOfMemoryError) as err:
            torch.empty(2 * MiB, dtype=torch.uint8)
        assert "Tried to allocate 2.00 MiB" in str(err.value)
        assert "budget 10.00 MiB" in str(err.value)
        del a
    # the budget ends with the block
    b = torch.empty(20 * MiB, dtype=torch.uint8)
    del b


def test_budget_accepts_int_bytes():
    with memfit.simulated_device(10 * MiB) as dev:
        assert dev.budget_bytes == 10 * MiB
        with pytest.raises(torch.cuda.OutOfMemoryError):
            torch.empty(11 * MiB, dtype=torch.uint8)


@pytest.mark.parametrize("bad", ["16 GB", "-1", "abc", "16GB", -1, 1.5, None])
def test_bad_budget_says_which_forms_are_accepted(bad):
    with pytest.raises(ValueError) as err:
        with memfit.simulated_device(bad):
            pass
    msg = str(err.value)
    assert "GiB" in msg, msg


def test_a_budget_beyond_int64_bytes_is_refused_with_the_limit():
    with pytest.raises(ValueError, match=r"^\[simulated_device\] 10+ bytes is more than "
                                         r"memfit can count \(at most 2\*\*63 - 1 bytes"):
        with memfit.simulated_device(10**30):
            pass
    with memfit.simulated_device((1 << 63) - 1) as dev:  # the largest is accepted
        assert dev.budget_bytes == (1 << 63) - 1


def test_allocator_restored_after_tracking():
    assert not memfit._memfit.tracking_installed()
    with memfit.track():
        assert memfit._memfit.tracking_installed()
    assert not memfit._memfit.tracking_installed()


def test_live_bytes_return_to_start_after_forward_backward():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)
    )
    with memfit.track(model) as t:
        for _ in range(2):
            x = torch.randn(16, 32)
            y = torch.randint(0, 4, (16,))
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            model.zero_grad(set_to_none=True)
            del x, y, loss
        assert t.live_bytes == 0
        assert t.peak_bytes > 0


def test_module_paths_are_attributed():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU())
    with memfit.track(model) as t:
        t.phase("forward")
        out = model(torch.ones(4, 8))
    modules = {m for (_, _, _, _, _, _, m, _) in t.timeline.events()}
    assert "0 (Linear)" in modules and "1 (ReLU)" in modules
    del out


def small_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def test_track_with_model_and_optimizer_names_phases_and_categories_as_profile_does():
    model = small_net()
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(4, 8)
    with memfit.track(model, opt) as t:
        model(x).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    tl = t.timeline
    assert [(p.name, p.iteration) for p in tl.phase_summaries()] == [
        ("forward", 1), ("loss", 1), ("backward", 1), ("optimizer_step", 1), ("zero_grad", 1)]
    assert tl.peak_phase() == "optimizer_step"
    b = tl.breakdown_at_peak()
    state = sum(v.nbytes for st in opt.state.values() for v in st.values())
    grads = sum(p.nbytes for p in model.parameters())
    assert b["categories"]["optimizer_state"] == state
    assert b["categories"]["gradient"] == grads
    assert b["categories"]["other"] == 0
    events = tl.events()
    forward = {e[6] for e in events if e[0] == "alloc" and e[5] == "forward"}
    assert forward == {"0 (Linear)", "1 (ReLU)", "2 (Linear)"}
    # Adam's state tensors, made in its step, each classified as state.
    assert {e[4] for e in events if e[0] == "alloc" and e[5] == "optimizer_step"} >= {
        "optimizer_state"}


def test_track_classifies_parameters_and_gradients_made_inside_the_block():
    model = small_net()
    with memfit.track(model) as t:
        model.double()  # new parameter storages, made in the block
        model(torch.randn(4, 8, dtype=torch.float64)).sum().backward()
    cats = {}
    for kind, nbytes, _, _, cat, _, _, _ in t.timeline.events():
        if kind == "alloc":
            cats[cat] = cats.get(cat, 0) + nbytes
    params = sum(p.nbytes for p in model.parameters())
    assert cats["parameter"] == params
    assert cats["gradient"] >= params
    assert t.timeline.peak_phase() in ("backward", "loss", "forward")


def test_track_refuses_an_optimizer_without_its_model():
    model = small_net()
    with pytest.raises(ValueError, match=r"^\[track\] an optimizer needs its model"):
        with memfit.track(optimizer=torch.optim.SGD(model.parameters(), lr=0.1)):
            pass
