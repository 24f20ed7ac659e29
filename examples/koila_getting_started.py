"""koila's getting-started example (its README, "Getting started"), run with
memfit: only the import changed, from `from koila import lazy` to
`from memfit import lazy`. (Two typos of the README are fixed: the labels
come from torch.randint, and the model is called on `input`.)

The step runs eagerly first, then with the wrapped tensors; the outputs,
losses and gradients of the two are compared, mixing eager and lazy values
as a user debugging the switch would (torch.allclose(eager_out, out)).

    PYTHONPATH=build/python python3 examples/koila_getting_started.py
"""

import torch
from torch.nn import CrossEntropyLoss, Flatten, Linear, Module, ReLU, Sequential

from memfit import lazy


class NeuralNetwork(Module):
    def __init__(self):
        super(NeuralNetwork, self).__init__()
        self.flatten = Flatten()
        self.linear_relu_stack = Sequential(
            Linear(28 * 28, 512),
            ReLU(),
            Linear(512, 512),
            ReLU(),
            Linear(512, 10),
        )

    def forward(self, x):
        x = self.flatten(x)
        logits = self.linear_relu_stack(x)
        return logits


def main():
    torch.manual_seed(0)
    # A batch of MNIST image
    input = torch.randn(9, 28, 28)
    # A batch of labels
    label = torch.randint(0, 10, [9])

    nn = NeuralNetwork()
    loss_fn = CrossEntropyLoss()

    # Calculate losses
    out = nn(input)
    loss = loss_fn(out, label)
    # Backward pass
    nn.zero_grad()
    loss.backward()
    eager_out, eager_loss = out.detach(), loss.item()
    eager_grads = [p.grad.clone() for p in nn.parameters()]

    # Wrap the input tensor and label tensor.
    # If a batch argument is provided, that dimension of the tensor would be treated as the batch.
    # In this case, the first dimension (dim=0) is used as batch's dimension.
    (input, label) = lazy(input, label, batch=0)

    out = nn(input)
    loss = loss_fn(out, label)
    nn.zero_grad()
    loss.backward()

    same_out = torch.allclose(eager_out, out, atol=1e-6)
    same_grads = all(torch.allclose(p.grad, g, atol=1e-6)
                     for p, g in zip(nn.parameters(), eager_grads))
    print(f"loss: eager {eager_loss:.6f}, lazy {loss.item():.6f}")
    print(f"outputs equal: {same_out}; gradients equal: {same_grads}")
    return same_out and same_grads and abs(loss.item() - eager_loss) <= 1e-6 * abs(eager_loss)


if __name__ == "__main__":
    raise SystemExit(0 if main() else 1)
