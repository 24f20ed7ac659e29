"""find_batch_size fits the step the user runs, not memfit's own: the state
their optimizer and model hold when they ask, the mode the model is in, and
the shape of their loop. The truth is not memfit's: plain steps of the
user's loop (no recorder) under memfit.simulated_device at the budget, the
model and optimizer built inside it. Each answer must run, and 5% more must
not."""

import copy
import gc

import pytest
import torch

import memfit
from memfit.testing.truth import plain_steps_run

BUDGET = 12 << 20


@pytest.fixture(autouse=True)
def _frozen_heap():
    """Each plain_steps_run collects garbage twice, a walk of every object
    alive: half this module's time in a process that ran earlier tests.
    Collected once and frozen, what was alive when the test began is left
    out of those walks; none of it becomes garbage during the test, so each
    collection frees, and the truth counts, the same bytes."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


def mlp(widths=(256, 512, 512, 10), dropout=0.0):
    layers = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
        if dropout:
            layers.append(torch.nn.Dropout(dropout))
    return torch.nn.Sequential(*layers[:-2 if dropout else -1])


def batch(b, width=256):
    return torch.randn(b, width), torch.randint(0, 10, (b,))


def quickstart(model, opt, b, set_to_none=True):
    x, y = batch(b)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad(set_to_none=set_to_none)


def tutorial(model, opt, b):
    x, y = batch(b)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


def accumulated(n):
    def loop(model, opt, b):
        for _ in range(n):
            x, y = batch(b)
            (torch.nn.functional.cross_entropy(model(x), y) / n).backward()
        opt.step()
        opt.zero_grad()
    return loop


def runs(build, make_opt, b, loop, steps=3, eval_mode=False, budget=BUDGET):
    """Whether `steps` plain steps of `loop` at batch `b` run under the
    simulated device of `budget`, the model and optimizer made inside it."""
    def made():
        model = build()
        if eval_mode:
            model.eval()
        return model, make_opt(model), b

    return plain_steps_run(budget, made, loop, steps)


def assert_tight(answer, build, make_opt, loop, **kw):
    """The answer runs the loop, and 5% more does not."""
    assert runs(build, make_opt, answer, loop, **kw), f"batch {answer} ran out of memory"
    more = int(answer * 1.05) + 1
    assert not runs(build, make_opt, more, loop, **kw), f"batch {more} ran too: not tight"


def adam(model):
    return torch.optim.Adam(model.parameters(), lr=1e-3)


@pytest.mark.parametrize("mode", ["cpu", "meta"])
def test_adams_state_held_after_a_step_is_counted_and_the_answer_runs(mode):
    torch.manual_seed(0)
    model = mlp()
    opt = adam(model)
    x, y = batch(8)
    quickstart(model, opt, 8)  # a warm-up step: Adam holds 2x the parameters now
    fit = memfit.find_batch_size(model, x, y, optimizer=opt, budget=BUDGET, mode=mode)
    assert fit.mode == mode
    assert any("of optimizer state" in n for n in fit.notes), fit.notes
    assert_tight(fit.max_batch, mlp, adam, quickstart)


def test_held_state_and_a_resumed_checkpoint_answer_as_a_fresh_optimizer_does():
    torch.manual_seed(0)
    model = mlp()
    x, y = batch(8)
    fresh = memfit.find_batch_size(model, x, y, optimizer=adam(model), budget=BUDGET)
    opt = adam(model)
    quickstart(model, opt, 8)
    held = memfit.find_batch_size(model, x, y, optimizer=opt, budget=BUDGET)
    resumed = adam(model)
    resumed.load_state_dict(copy.deepcopy(opt.state_dict()))
    from_checkpoint = memfit.find_batch_size(model, x, y, optimizer=resumed, budget=BUDGET)
    assert abs(held.max_batch - fresh.max_batch) <= 1
    assert abs(from_checkpoint.max_batch - fresh.max_batch) <= 1


def test_an_optimizer_whose_state_exists_from_construction_is_counted():
    def adagrad(model):
        return torch.optim.Adagrad(model.parameters(), lr=1e-2)

    torch.manual_seed(0)
    model = mlp()
    x, y = batch(8)
    fit = memfit.find_batch_size(model, x, y, optimizer=adagrad(model), budget=BUDGET)
    assert_tight(fit.max_batch, mlp, adagrad, quickstart)


def test_gradients_zeroed_in_place_are_fitted_with_set_to_none_false():
    torch.manual_seed(0)
    model = mlp()
    x, y = batch(8)
    fit = memfit.find_batch_size(model, x, y, optimizer=adam(model), budget=BUDGET,
                                 set_to_none=False)
    assert any("set_to_none=False" in n for n in fit.notes), fit.notes
    assert_tight(fit.max_batch, mlp, adam,
                 lambda m, o, b: quickstart(m, o, b, set_to_none=False))


def test_accumulated_micro_batches_keep_the_first_ones_gradients_through_the_later_ones():
    torch.manual_seed(0)
    model = mlp()
    x, y = batch(8)
    fit = memfit.find_batch_size(model, x, y, optimizer=adam(model), budget=BUDGET,
                                 accumulation_steps=4)
    assert any("4 accumulated micro-batches" in n for n in fit.notes), fit.notes
    assert_tight(fit.max_batch, mlp, adam, accumulated(4))


def test_the_tutorial_order_keeps_the_last_steps_gradients_through_the_forward():
    torch.manual_seed(0)
    model = mlp()
    x, y = batch(8)
    fit = memfit.find_batch_size(model, x, y, optimizer=adam(model), budget=BUDGET,
                                 zero_grad="before_backward")
    assert_tight(fit.max_batch, mlp, adam, tutorial)


def test_a_model_left_in_eval_mode_is_fitted_in_train_mode_and_left_in_eval_mode():
    def build():
        return mlp(dropout=0.1)

    torch.manual_seed(0)
    model = build()
    model.eval()  # after validation, or as from_pretrained returns it
    x, y = batch(8)
    fit = memfit.find_batch_size(model, x, y, optimizer=adam(model), budget=BUDGET)
    assert not any(m.training for m in model.modules())
    assert any("eval mode" in n for n in fit.notes), fit.notes
    assert_tight(fit.max_batch, build, adam, quickstart)  # trains in train mode
    as_is = memfit.find_batch_size(model, x, y, optimizer=adam(model), budget=BUDGET,
                                   train_mode=False)
    assert_tight(as_is.max_batch, build, adam, quickstart, eval_mode=True)
    assert as_is.max_batch > fit.max_batch  # no dropout masks in eval mode


def test_gradients_already_there_are_counted_through_the_forward():
    torch.manual_seed(0)
    model = mlp()
    opt = adam(model)
    x, y = batch(8)
    torch.nn.functional.cross_entropy(model(x), y).backward()  # .grad left by the user
    fit = memfit.find_batch_size(model, x, y, optimizer=opt, budget=BUDGET)
    assert any("of .grad" in n for n in fit.notes), fit.notes
    # The loop that keeps them: the tutorial order (gradients alive through the forward).
    assert runs(mlp, adam, fit.max_batch, tutorial)


def test_the_users_state_comes_back_as_the_very_same_tensors_with_the_same_values():
    torch.manual_seed(0)
    model = mlp(dropout=0.1)
    opt = adam(model)
    x, y = batch(8)
    quickstart(model, opt, 8)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    model.eval()
    state = {id(p): {k: (v, v.clone()) for k, v in s.items()} for p, s in opt.state.items()}
    grads = [(p.grad, p.grad.clone()) for p in model.parameters()]
    lr = opt.param_groups[0]["lr"]
    for mode in ("cpu", "meta"):
        memfit.find_batch_size(model, x, y, optimizer=opt, budget=BUDGET, mode=mode)
    assert not model.training
    assert opt.param_groups[0]["lr"] == lr
    for p, s in opt.state.items():
        assert set(s) == set(state[id(p)])
        for k, v in s.items():
            was, value = state[id(p)][k]
            assert v is was and torch.equal(v, value), k
    for p, (g, value) in zip(model.parameters(), grads):
        assert p.grad is g and torch.equal(g, value)


def test_the_default_budget_counts_what_the_user_keeps_beside_the_step():
    def ema_loop(ema):
        def loop(model, opt, b):
            quickstart(model, opt, b)
            with torch.no_grad():
                for e, p in zip(ema.parameters(), model.parameters()):
                    e.lerp_(p, 0.01)
        return loop

    torch.manual_seed(0)
    with memfit.simulated_device(BUDGET):
        model = mlp()
        ema = copy.deepcopy(model).requires_grad_(False)
        opt = adam(model)
        x, y = batch(8)
        fit = memfit.find_batch_size(model, x, y, optimizer=opt)
        explicit = memfit.find_batch_size(model, x, y, optimizer=opt, budget=BUDGET)
        loop = ema_loop(ema)
        del x, y
        for _ in range(3):
            loop(model, opt, fit.max_batch)
    assert explicit.max_batch == fit.max_batch  # the budget is the whole device
    assert any("beside the step" in n for n in explicit.notes), explicit.notes


def test_auto_batch_size_fits_the_micro_batch_of_the_loop_that_accumulates():
    torch.manual_seed(0)
    model = mlp()
    x, y = batch(8)

    @memfit.auto_batch_size(4096, model=model, inputs=x, target=y, optimizer=adam(model),
                            budget=BUDGET)
    def train(micro, steps):
        return micro, steps

    micro, steps = train()
    assert steps > 1 and micro * steps == 4096
    assert runs(mlp, adam, micro, accumulated(steps), steps=2)


def small_gpt():
    from memfit.testing.models import Gpt

    return Gpt(layers=2, width=128, heads=4, context=64, vocab=512)


def cnn():
    from memfit.testing.models import Cnn

    return Cnn()


def gpt_batch(b):
    return torch.randint(0, 512, (b, 64)), torch.randint(0, 512, (b, 64))


def cnn_batch(b):
    return torch.randn(b, 3, 32, 32), torch.randint(0, 10, (b,))


def gpt_loss(out, target):
    return torch.nn.functional.cross_entropy(out.flatten(0, 1), target.flatten())


# A CNN on meta is left out: the CPU's convolution kernels take scratch that
# no meta kernel has, so a meta answer for a CPU budget is flagged unverified
# and can be above what runs (memfit.profile's notes; bench/meta_vs_cpu.py).
@pytest.mark.parametrize("make_model, make_batch, loss_fn, mode", [
    (cnn, cnn_batch, torch.nn.functional.cross_entropy, "cpu"),
    (small_gpt, gpt_batch, gpt_loss, "cpu"),
    (small_gpt, gpt_batch, gpt_loss, "meta"),
], ids=["cnn-cpu", "gpt-cpu", "gpt-meta"])
def test_held_adam_state_is_counted_on_a_cnn_and_a_gpt(make_model, make_batch, loss_fn, mode):
    def step(model, opt, b):
        x, y = make_batch(b)
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    torch.manual_seed(0)
    model = make_model()
    opt = adam(model)
    step(model, opt, 2)  # Adam holds its state now
    budget = memfit.profile(model, *make_batch(2), loss_fn=loss_fn, optimizer=opt).peak_bytes * 2
    # The loop drops the logits once the loss exists (one line).
    fit = memfit.find_batch_size(model, *make_batch(2), loss_fn=loss_fn, optimizer=opt,
                                 budget=budget, mode=mode, keep_output=False)
    assert fit.mode == mode and fit.max_batch >= 4

    assert_tight(fit.max_batch, make_model, adam, step, steps=2, budget=budget)


def test_advise_records_its_rows_in_the_users_loop():
    torch.manual_seed(0)
    model = mlp()
    x, y = batch(1024)
    plain = memfit.advise(model, x, y, optimizer="adam", repeats=0, settings=None)
    kept = memfit.advise(model, x, y, optimizer="adam", repeats=0, settings=None,
                         set_to_none=False)
    # The user's loop zeroes in place: its plain step is the default's
    # "zero_grad in place" row, to the byte.
    in_place = next(r for r in plain.rows if r.name == "zero_grad in place")
    assert kept.plain_peak_bytes == in_place.peak_bytes > plain.plain_peak_bytes
    with pytest.raises(ValueError, match=r"^\[advise\] zero_grad must be one of"):
        memfit.advise(model, x, y, optimizer="adam", zero_grad="late")


@pytest.mark.parametrize("mode", ["cpu", "meta"])
def test_an_hf_model_in_eval_mode_with_adamws_state_held_is_fitted_as_it_trains(mode):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256,
                                  n_positions=64, attn_implementation="eager")

    def build():
        return transformers.GPT2LMHeadModel(cfg)

    def adamw(model):
        return torch.optim.AdamW(model.parameters(), lr=1e-4)

    def hf_batch(b):
        ids = torch.randint(0, 256, (b, 64))
        return {"input_ids": ids, "labels": ids}

    def step(model, opt, b):
        model.train()  # as HF's Trainer does
        model(**hf_batch(b)).loss.backward()
        opt.step()
        opt.zero_grad()

    torch.manual_seed(0)
    model = build()
    opt = adamw(model)
    step(model, opt, 2)
    model.eval()  # as from_pretrained returns it
    budget = 3 * memfit.profile(model, hf_batch(2), optimizer=opt).peak_bytes
    # HF's Trainer drops the output once the loss exists (compute_loss).
    fit = memfit.find_batch_size(model, hf_batch(2), optimizer=opt, budget=budget, mode=mode,
                                 keep_output=False)
    assert fit.mode == mode and not model.training

    assert_tight(fit.max_batch, build, adamw, step, steps=2, budget=budget)


def test_parameters_no_optimizer_given_steps_are_named_in_the_answer():
    # A loop with two optimizers, sized with the head's: the backbone's
    # Adam state is not in memfit's step, and plain steps of the loop run out
    # at its answer. See Note [Parameters no optimizer given steps] (budget.py).
    def two_adams(model):
        return adam(model[-1]), adam(model[:-1])

    def both(model, opts, b):
        x, y = batch(b)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        for opt in opts:
            opt.step()
        for opt in opts:
            opt.zero_grad()

    torch.manual_seed(0)
    model = mlp()
    x, y = batch(8)
    fit = memfit.find_batch_size(model, x, y, optimizer=adam(model[-1]), budget=BUDGET)
    backbone = sum(p.numel() * p.element_size() for p in model[:-1].parameters())
    said = [n for n in fit.notes if "in no optimizer given" in n]
    assert len(said) == 1, fit.notes
    assert said[0].startswith(f"{memfit.format_bytes(backbone)} of trainable parameters "
                              f"(4 tensors) are in no optimizer given")
    assert not runs(mlp, two_adams, fit.max_batch, both)
    whole = memfit.find_batch_size(model, x, y, optimizer=adam(model), budget=BUDGET,
                                   verify=False)
    assert not any("in no optimizer given" in n for n in whole.notes), whole.notes
