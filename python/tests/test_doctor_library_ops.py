"""not_in_place names only ops the user can change: an add inside a
transformers model (its residual `residual + hidden_states`) was reported
at the user's `outputs = model(**batch)` line with the fix `x.add_(y)`,
a line that has no add; torch's own modules (nn.ReLU()) are still the
user's to change, at the line that calls the model."""

import torch
import torch.nn.functional as F
from torch import nn

import memfit
from memfit.testing.models import tiny_llama


def test_an_add_inside_a_transformers_model_is_not_the_users_line():
    model = tiny_llama()
    model.config.use_cache = False
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    with memfit.doctor(model, opt) as d:
        for _ in range(5):
            batch = {"input_ids": torch.randint(0, 64, (4, 32), generator=g)}
            batch["labels"] = batch["input_ids"].clone()
            outputs = model(**batch)
            outputs.loss.backward()
            opt.step()
            opt.zero_grad()
    assert [f for f in d.findings if f.kind == "not_in_place"] == [], d.report()


def test_an_out_of_place_nn_relu_is_still_found_at_the_models_call():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 2048), nn.ReLU(), nn.Linear(2048, 10)).eval()
    with memfit.doctor(model) as d:
        with torch.no_grad():
            for _ in range(5):
                F.softmax(model(torch.randn(256, 64)), 1)
    found = [f for f in d.findings if f.kind == "not_in_place"]
    assert found and "inplace=True" in found[0].fix, d.report()
