"""memfit.auto_batch_size with the real accelerate: on an
accelerator.prepare()d model and optimizer, on the simulated device, it picks
a micro-batch that fits and sets the accelerator's
gradient_accumulation_steps, so that every optimizer step of accelerate's
own accumulate() loop takes exactly the effective batch, 20 steps, no OOM."""

import gc

import pytest
import torch
import torch.nn.functional as F

import memfit

accelerate = pytest.importorskip("accelerate")

X = torch.randn(1024, 64, generator=torch.Generator().manual_seed(0))
Y = torch.randint(0, 10, (1024,), generator=torch.Generator().manual_seed(1))
EFFECTIVE = 960


class Samples(torch.utils.data.Dataset):
    def __len__(self):
        return 1 << 17

    def __getitem__(self, i):
        return X[i % len(X)], Y[i % len(X)]


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 10))


@pytest.fixture
def accelerator():
    acc = accelerate.Accelerator(cpu=True)
    yield acc
    acc.gradient_accumulation_steps = 1  # the accelerator's state is the process's
    gc.collect()


@pytest.mark.slow
def test_auto_batch_size_keeps_accelerates_effective_batch_exact(accelerator):
    gc.collect()
    with memfit.simulated_device("3MiB"):
        model = mlp()
        model, opt = accelerator.prepare(model, torch.optim.Adam(model.parameters(), lr=1e-3))
        taken = []  # samples behind each optimizer step

        @memfit.auto_batch_size(EFFECTIVE, model=model, inputs=X[:4].clone(),
                                target=Y[:4].clone(), optimizer=opt)
        def train(batch_size, accumulation_steps):
            loader = accelerator.prepare(torch.utils.data.DataLoader(Samples(),
                                                                     batch_size=batch_size))
            samples = 0
            for x, y in loader:
                with accelerator.accumulate(model):
                    accelerator.backward(F.cross_entropy(model(x), y))
                    opt.step()
                    opt.zero_grad()
                samples += x.shape[0]
                if accelerator.sync_gradients:
                    taken.append(samples)
                    samples = 0
                if len(taken) == 20:
                    return batch_size, accumulation_steps

        b, k = train()
        assert b * k == EFFECTIVE and k > 1
        assert accelerator.gradient_accumulation_steps == k
        assert taken == [EFFECTIVE] * 20
        # The optimizer stepped 20 times, not once per micro-batch.
        p = next(model.parameters())
        assert int(opt.optimizer.state[p]["step"]) == 20
        model = opt = None
