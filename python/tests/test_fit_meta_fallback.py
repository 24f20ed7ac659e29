"""mode='meta' on a step the meta device cannot run (a forward that makes a
host tensor, torch.arange without device=) falls back to the CPU: the answer
of find_batch_size says why its mode is cpu, as the profile does, once."""

import torch
import torch.nn.functional as F

import memfit


class HostTensorInForward(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.lin(x) + torch.arange(4.0)  # on the host, whatever x is on


def test_a_fit_that_falls_back_from_meta_says_why():
    torch.manual_seed(0)
    model = HostTensorInForward()
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    fit = memfit.find_batch_size(model, x, y, loss_fn=F.mse_loss, optimizer="adam",
                                 budget="1MiB", mode="meta")
    assert fit.mode == "cpu" and fit.verified
    said = [n for n in fit.notes if n.startswith("meta mode could not run this step (")]
    assert len(said) == 1 and said[0].endswith("; fell back to cpu mode"), fit.notes
    report = memfit.profile(model, x, y, loss_fn=F.mse_loss, optimizer="adam", mode="meta")
    assert report.mode == "cpu"
    assert sum(n.startswith("meta mode could not run") for n in report.notes) == 1, report.notes
