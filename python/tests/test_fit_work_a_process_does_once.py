"""An optimizer whose first step in the process does work no later step
repeats (torchao's 8-bit AdamW compiles its step at its first call: 32 MB
at that step, 6.1 MB at every one after): the answer is for the steps the
user's loop runs after find_batch_size, not for that one-time peak. The
truth is plain steps of the loop on a simulated device, in the same
process. See Note [Work a process does once] (fit.py)."""

import torch

import memfit
from memfit.testing.truth import largest_that_fits, plain_steps_run
from test_fit_optimizer_state_in_attributes import _step

BUDGET = 12 << 20


def _compiling_sgd():
    class CompilingSGD(torch.optim.SGD):
        """SGD whose first step in the process takes 8 MiB of scratch for a
        moment, as a compile of its step would."""
        compiled = False

        @torch.no_grad()
        def step(self, closure=None):
            if not CompilingSGD.compiled:
                scratch = torch.empty(8 << 20, dtype=torch.uint8)
                scratch.fill_(0)
                CompilingSGD.compiled = True
            return super().step(closure)
    return CompilingSGD


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 10))


def test_a_first_step_that_compiles_is_not_the_steps_the_loop_runs():
    sgd = _compiling_sgd()
    torch.manual_seed(0)
    model = _mlp()
    x, y = torch.randn(8, 256), torch.randint(0, 10, (8,))
    fit = memfit.find_batch_size(model, x, y, optimizer=sgd(model.parameters(), lr=0.1),
                                 budget=BUDGET)

    def fits(b):
        def build():
            m = _mlp()
            return m, sgd(m.parameters(), lr=0.1), b
        return plain_steps_run(BUDGET, build, _step, steps=3)
    truth = largest_that_fits(fits, fit.max_batch)
    assert fit.max_batch <= truth
    assert fit.max_batch >= 0.95 * truth, (fit.max_batch, truth)
