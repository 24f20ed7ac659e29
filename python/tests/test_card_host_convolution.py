"""A card's step rehearsed on this CPU leaves out what the host's convolution
kernels take and free inside the op (Note [A card's rehearsal drops the
host's convolution temporaries], op_frames.h): oneDNN's reorders and
scratchpads, whose size is the host CPU's. A host target keeps them: they
are real there."""

import json
import os
import subprocess
import sys

import torch

import memfit

# A small ResNet-like step: convolutions with 16 channels (which oneDNN
# reorders into its blocked layouts), BatchNorm, a residual sum, a head.
STEP = """
import json, sys
import torch
import memfit

torch.manual_seed(0)
torch.set_num_threads(2)  # oneDNN's scratchpads are per thread: not the worker's one


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(16)
        self.conv = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x):
        h = torch.relu(self.bn(self.stem(x)))
        h = torch.relu(self.conv(h) + h)
        return self.head(h.mean((2, 3)))


x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
out = {}
for target in sys.argv[1:]:
    kw = {"mode": "cpu"} if target == "cuda" else {}
    report = memfit.profile(Net(), x, y, loss_fn=torch.nn.functional.cross_entropy,
                            optimizer="adam", iterations=2, target_device=target, **kw)
    out[target] = [report.peak_bytes, [e[:2] for e in report.timeline.events()]]
print(json.dumps(out))
"""


def recorded(targets, **env):
    run = subprocess.run([sys.executable, "-c", STEP, *targets], capture_output=True,
                         text=True, env={**os.environ, **env}, timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.splitlines()[-1])


def test_a_cards_step_records_the_same_bytes_under_onednns_avx2_kernels():
    # Each run has its own process: oneDNN reads ONEDNN_MAX_CPU_ISA once. On
    # a CPU with AVX-512, on two threads, its AVX-512 kernels take other
    # temporaries than its AVX2 ones (this step's host recording: 886732 B
    # at the peak against 856780 B), which a card's recording counted; on a
    # CPU without, both runs are AVX2's alike.
    default = recorded(["cuda"])["cuda"]
    avx2 = recorded(["cuda"], ONEDNN_MAX_CPU_ISA="AVX2")["cuda"]
    assert avx2[0] == default[0]
    assert avx2[1] == default[1]  # every event's kind and bytes, in order


def convolution_temporaries(report):
    return [e[1] for e in report.timeline.events()
            if e[0] == "alloc" and e[1] > 0 and e[4] == "temporary" and "convolution" in e[-1]]


def test_a_host_target_keeps_its_convolutions_temporaries_and_a_card_target_does_not():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, padding=1, bias=False),
                                torch.nn.Flatten())
    x, y = torch.randn(4, 16, 16, 16), torch.zeros(4, 16 * 16 * 16)
    kw = dict(loss_fn=torch.nn.functional.mse_loss, optimizer="sgd", iterations=2)
    host = memfit.profile(model, x, y, target_device="cpu", **kw)
    card = memfit.profile(model, x, y, target_device="cuda", mode="cpu", **kw)
    if torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled:
        assert convolution_temporaries(host)  # oneDNN's reorders, real on the host
    assert convolution_temporaries(card) == []
    # What is left of the card's convolutions is their outputs, in each of
    # the two iterations: y, 4 x 16 x 16 x 16 floats, and the weight's
    # gradient, 16 x 16 x 9 (x takes none).
    outputs = [e[1] for e in card.timeline.events()
               if e[0] == "alloc" and "convolution" in e[-1] and e[1] > 0]
    assert outputs == [65536, 9216] * 2, outputs
