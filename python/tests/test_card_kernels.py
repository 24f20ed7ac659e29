"""What a card's kernels take inside an op and the host's do not, added to a
rehearsal for a CUDA target: the staging buffer of a sum split across thread
blocks (Note [A CUDA reduction's staging buffer], card_kernels.cpp)."""

import torch

import memfit

STAGING = "CUDA reduction's staging buffer"


def staging_bytes(report):
    return [e[1] for e in report.timeline.events()
            if e[0] == "alloc" and e[-1] == STAGING and e[4] == "temporary" and e[1] > 0]


def linear_step(batch, target_device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10))
    x, y = torch.randn(batch, 784), torch.randint(0, 10, (batch,))
    return memfit.profile(model, x, y, loss_fn=torch.nn.functional.cross_entropy,
                          optimizer="sgd", iterations=1, target_device=target_device)


def test_a_bias_gradient_over_a_wide_batch_holds_its_staging_buffer_on_a_card():
    # [1024, 512] summed over the batch: 16 blocks share each output, 128
    # lanes each, 4 B a lane: 4 MiB, and 16 B of semaphores.
    card = linear_step(1024, "cuda")
    assert staging_bytes(card) == [4 << 20, 16]
    assert staging_bytes(linear_step(1024, "cpu")) == []


def test_a_small_batch_reduces_in_one_block():
    assert staging_bytes(linear_step(64, "cuda")) == []
