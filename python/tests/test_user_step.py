"""The user's own step as the unit every front runs (Note [The step function's
contract], user_step.py): a step function, a Hugging Face model that computes
its own loss, the batch kinds it is sliced as, and the one-line errors."""

import types

import pytest
import torch
import torch.nn.functional as F

import memfit

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))


def data(n=12):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


def ce_step(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def gpt2(head=True, seq=16, vocab=64):
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=vocab,
                                     n_positions=seq, attn_implementation="eager",
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    cls = transformers.GPT2LMHeadModel if head else transformers.GPT2Model
    return cls(config)


def lm_batch(n=8, seq=16, vocab=64, labels=True):
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, vocab, (n, seq), generator=g)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if labels:
        batch["labels"] = ids.clone()
    return batch


# -- the step function ---------------------------------------------------------------


def test_a_step_function_records_the_same_bytes_as_loss_fn():
    x, y = data()
    # A step function's output dies with its locals: the one-line loop.
    plain = memfit.profile(mlp(), x, y, loss_fn=F.cross_entropy, optimizer="adam",
                           keep_output=False)
    stepped = memfit.profile(mlp(), (x, y), optimizer="adam", step=ce_step)
    # The same allocations: the step's forward and loss are one phase.
    assert stepped.peak_bytes == plain.peak_bytes
    assert stepped.categories_at_peak == plain.categories_at_peak
    assert any("one phase" in n for n in stepped.notes)


def test_a_step_gets_each_probe_as_the_kind_of_batch_it_was_given():
    x, y = data()
    encoding = transformers.BatchEncoding({"x": x, "y": y})
    # Kept on an object: a list the step reaches is put back after each
    # rehearsal (Note [What the user's functions keep]).
    probes = types.SimpleNamespace(seen=[])
    seen = probes.seen

    def step(model, batch):
        probes.seen.append((type(batch), batch["x"].shape[0], batch["y"].shape[0]))
        return F.cross_entropy(model(batch["x"]), batch["y"])

    fit = memfit.find_batch_size(mlp(), encoding, optimizer="sgd", budget="2MiB", step=step)
    assert fit.max_batch > 12  # probes repeat the 12 samples to larger batches
    assert {kind for kind, _, _ in seen} == {transformers.BatchEncoding}
    assert all(nx == ny for _, nx, ny in seen)
    assert len({nx for _, nx, _ in seen}) >= 3


@pytest.mark.numerics
@pytest.mark.parametrize("chunks", [1, 2, 4])
def test_trainer_with_a_step_function_gives_the_full_batch_gradients(chunks):
    torch.manual_seed(0)
    model = mlp().double()
    x, y = data()
    x = x.double()
    F.cross_entropy(model(x), y).backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    grads = []

    class Capture(torch.optim.SGD):
        def step(self, closure=None):
            grads.extend(p.grad.clone() for p in model.parameters())

    batch = {"x": x, "y": y}
    t = memfit.Trainer(model, Capture(model.parameters(), lr=0.0),
                       step=lambda m, b: F.cross_entropy(m(b["x"]), b["y"]),
                       micro_batch=-(-12 // chunks))
    r = t.step(batch)
    assert r.micro_batches == chunks and r.samples == 12
    for g, w in zip(grads, want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)  # float64: rounding only


def test_advise_takes_a_step_function():
    x, y = data(16)
    plain = memfit.advise(mlp(), x, y, loss_fn=F.cross_entropy, optimizer="adam", repeats=0,
                          settings=None, keep_output=False)  # as the step function's locals
    stepped = memfit.advise(mlp(), (x, y), optimizer="adam", repeats=0, settings=None,
                            step=ce_step)
    assert stepped.plain_peak_bytes == plain.plain_peak_bytes


# -- Hugging Face models that compute their own loss --------------------------------------


def test_an_hf_model_with_labels_needs_no_loss_fn():
    batch = lm_batch()
    model = gpt2()
    fit = memfit.find_batch_size(model, batch, optimizer="adam", budget="6MiB")
    assert fit.max_batch >= 8 and fit.verified
    # The Trainer splits the dict batch and trains on the model's own loss:
    # in float64, but for HF's loss, which casts the logits to fp32.
    model = gpt2().double()
    want = model(**batch).loss
    want.backward()
    ref = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    grads = []

    class Capture(torch.optim.SGD):
        def step(self, closure=None):
            grads.extend(p.grad.clone() for p in model.parameters())

    r = memfit.Trainer(model, Capture(model.parameters(), lr=0.0), micro_batch=4).step(batch)
    assert r.micro_batches == 2
    # The loss (about 4.2) is fp32, u = 2**-24: each half's mean over 60
    # tokens by torch's cascade sum is within log2(60) u of the sum of |l_t|,
    # and weighting and adding the halves adds 2 u: 8 u * 4.2 = 2e-6 at most.
    # Measured 3.2e-8.
    assert abs(r.loss - want.item()) < 1e-5
    # Mean over tokens per micro-batch weighted by samples: equal token counts
    # here. Everything is float64 but each token's logit gradient, which the
    # fp32 loss computes with 2 roundings more in a half (1/60 then 1/2, not
    # 1/120): at most 2 u relative per token, 2 u times the cancellation of
    # the sum over tokens in all. 1e-6 is 16 u; measured 7.3e-8 (1.2 u).
    for g, w in zip(grads, ref):
        assert ((g - w).norm() / w.norm()).item() < 1e-6


def test_an_hf_model_without_labels_is_refused_before_anything_runs():
    model = gpt2()
    t = memfit.Trainer(model, torch.optim.Adam(model.parameters()), budget="8MiB")
    with pytest.raises(ValueError) as e:
        t.step(lm_batch(labels=False))
    msg = str(e.value)
    assert msg.startswith("[Trainer.step] GPT2LMHeadModel computes its loss only from labels")
    assert "out.logits" in msg and "loss_fn=" in msg and "\n" not in msg
    assert t.planned is None  # no probe ran


def test_an_hf_model_with_no_loss_at_all_is_refused_when_the_trainer_is_built():
    model = gpt2(head=False)
    with pytest.raises(ValueError) as e:
        memfit.Trainer(model, torch.optim.Adam(model.parameters()))
    msg = str(e.value)
    assert msg.startswith("[Trainer] GPT2Model returns a ModelOutput with no loss")
    assert "loss_fn=" in msg and "out.logits" in msg and "\n" not in msg


class DictOut(torch.nn.Module):
    """Returns a mapping without a loss, as an HF model given no labels does."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 3)

    def forward(self, x):
        return {"logits": self.lin(x)}


@pytest.mark.parametrize("front, tag", [
    (lambda m, x: memfit.find_batch_size(m, x, optimizer="sgd", budget="1MiB"),
     "find_batch_size"),
    (lambda m, x: memfit.profile(m, x, optimizer="sgd"), "profile"),
    (lambda m, x: memfit.Trainer(m, torch.optim.SGD(m.parameters(), lr=0.1),
                                 budget="1MiB").step(x), "Trainer.step"),
])
def test_an_output_with_no_loss_names_out_logits_under_the_operation_called(front, tag):
    x, _ = data()
    with pytest.raises(ValueError) as e:
        front(DictOut(), x)
    msg = str(e.value)
    assert msg.startswith(f"[{tag}] the model returned a dict with no loss (out.logits")
    assert "loss_fn=" in msg and "\n" not in msg


@pytest.mark.parametrize("kwargs, message", [
    (dict(step=ce_step, loss_fn=F.cross_entropy), r"^\[profile\] pass step= or loss_fn=, not both"),
    (dict(step=lambda batch: batch), r"^\[profile\] step must take \(model, batch\)"),
    (dict(step=3), r"^\[profile\] step must be a function"),
    (dict(step=lambda m, b: m(b[0])), r"^\[profile\] the step returned a tensor of shape \(12, 3\)"),
    (dict(step=lambda m, b: None), r"^\[profile\] the step returned NoneType"),
])
def test_a_step_that_cannot_train_says_why_in_one_line(kwargs, message):
    x, y = data()
    with pytest.raises(ValueError, match=message) as e:
        memfit.profile(mlp(), (x, y), optimizer="sgd", **kwargs)
    assert "\n" not in str(e.value)


def test_a_step_and_a_separate_target_are_refused():
    x, y = data()
    with pytest.raises(ValueError, match=r"^\[find_batch_size\] pass the target inside the batch"):
        memfit.find_batch_size(mlp(), x, y, optimizer="sgd", budget="1MiB",
                               step=lambda m, b: m(b).sum())


def test_batch_encoding_is_cut_and_kept_as_a_batch_encoding():
    from memfit._step.batching import batch_size, narrow_batch, resize_batch

    enc = transformers.BatchEncoding(lm_batch(6))
    part = narrow_batch(enc, 2, 3)
    assert isinstance(part, transformers.BatchEncoding)
    assert part["input_ids"].shape == (3, 16)
    assert torch.equal(part["labels"], enc["labels"][2:5])
    assert batch_size(resize_batch(enc, 20)) == 20


def backward_inside(model, batch):
    loss = ce_step(model, batch)
    loss.backward()  # memfit's to run: the step returns the loss
    return loss


def whole_loop_inside(model, batch):
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    loss = ce_step(model, batch)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach()


@pytest.mark.parametrize("step, message", [
    (backward_inside, r"the step changed the parameters' .grad \(it ran backward"),
    (whole_loop_inside, r"the loss does not require grad.*a step function returns the loss"),
])
@pytest.mark.parametrize("front, tag", [
    (lambda m, b, s: memfit.profile(m, b, optimizer="sgd", step=s), "profile"),
    (lambda m, b, s: memfit.find_batch_size(m, b, optimizer="sgd", budget="1MiB", step=s),
     "find_batch_size"),
    (lambda m, b, s: memfit.Trainer(m, torch.optim.SGD(m.parameters(), lr=0.1), step=s,
                                    micro_batch=4).step(b), "Trainer.step"),
])
def test_a_step_that_runs_the_loop_itself_is_refused_in_one_line(step, message, front, tag):
    # It raised torch's "backward through the graph a second time", or for
    # a split Trainer step "element 0 of tensors does not require grad".
    with pytest.raises(ValueError, match=rf"^\[{tag}\] {message}") as e:
        front(mlp(), data(), step)
    assert "\n" not in str(e.value)


def test_a_step_that_zeroes_the_gradients_is_refused_when_the_trainer_splits_it():
    # Split into micro-batches of 4, each forward's zero_grad dropped what the
    # earlier ones accumulated: the optimizer got the last micro-batch's
    # gradients alone (0.18 off the whole batch's), and nothing said so.
    def step(model, batch):
        model.zero_grad()
        return ce_step(model, batch)

    model = mlp()
    t = memfit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), step=step,
                       micro_batch=4)
    with pytest.raises(ValueError, match=r"^\[Trainer.step\] the step zeroed the .grad the "
                                         r"earlier micro-batches accumulated") as e:
        t.step(data())
    assert "\n" not in str(e.value)
    assert all(p.grad is None for p in model.parameters())  # the step did not happen
    whole = memfit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), step=step)
    assert whole.step(data()).micro_batches == 1  # unsplit, it is the user's own step
