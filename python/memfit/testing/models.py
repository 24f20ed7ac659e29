"""Python twins of memfit's built-in models (src/torch/models.cpp), the
torchvision models the benchmarks use, with synthetic batches, and a tiny
HF Llama (tiny_llama): shared by the tests, bench/ and scripts/gpu_check.sh.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__: list = []


class Pointwise(nn.Module):
    """The compiled-model issue's model: a Linear, n pointwise layers
    (h * sigmoid(h) + tanh(h) / 2, which inductor fuses and eager keeps each
    intermediate of for backward), a Linear over the mean of the sequence."""

    def __init__(self, d=256, n=6, classes=10):
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.out = nn.Linear(d, classes)
        self.n = n

    def forward(self, x):
        h = self.inp(x)
        for _ in range(self.n):
            h = h * torch.sigmoid(h) + torch.tanh(h) * 0.5
        return self.out(h.mean(1))


class Mlp(nn.Module):
    """784-512-512-10 on 28x28 images, 10 classes."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 512)
        self.fc2 = nn.Linear(512, 512)
        self.fc3 = nn.Linear(512, 10)

    def forward(self, x):
        h = x.flatten(1)
        h = torch.relu(self.fc1(h))
        h = torch.relu(self.fc2(h))
        return self.fc3(h)


class ResidualBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Conv2d(cin, cout, 1, stride=stride, bias=False)

    def forward(self, x):
        h = torch.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        s = self.shortcut(x) if self.shortcut is not None else x
        return torch.relu(h + s)


class Cnn(nn.Module):
    """A small ResNet on 3x32x32 images, 10 classes."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(32)
        self.block1 = ResidualBlock(32, 32, 1)
        self.block2 = ResidualBlock(32, 64, 2)
        self.block3 = ResidualBlock(64, 128, 2)
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        h = torch.relu(self.bn(self.stem(x)))
        h = self.block3(self.block2(self.block1(h)))
        h = F.adaptive_avg_pool2d(h, 1).flatten(1)
        return self.head(h)


class GptBlock(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads)
        q, k, v = (qkv.select(2, i).transpose(1, 2) for i in range(3))
        att = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(mask, -1e9).softmax(-1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(b, t, c)
        x1 = x + self.proj(y)
        return x1 + self.out(F.gelu(self.fc(self.ln2(x1))))


class Gpt(nn.Module):
    """A decoder-only transformer over token ids (memfit's defaults: 4 layers,
    width 256, 4 heads, context 128, vocab 1024)."""

    def __init__(self, layers=4, width=256, heads=4, context=128, vocab=1024):
        super().__init__()
        self.context, self.vocab = context, vocab
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(GptBlock(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, ids):
        positions = torch.arange(ids.shape[1], device=ids.device)
        h = self.tok(ids) + self.pos(positions)
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln(h))


class Lstm(nn.Module):
    """A two-layer LSTM classifier over 32 steps of 28-dim vectors."""

    def __init__(self, hidden=256):
        super().__init__()
        self.lstm = nn.LSTM(28, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, 10)

    def forward(self, x):
        seq, _ = self.lstm(x)
        return self.head(seq.select(1, -1))


def gpt_loss(output, target):
    return F.cross_entropy(output.flatten(0, 1), target.flatten())


class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock: two 3x3 convs with BatchNorm, a skip."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        # In place as torchvision writes it: ReLU(inplace=True), out += identity.
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = self.bn2(self.conv2(out))
        out += x if self.downsample is None else self.downsample(x)
        return F.relu(out, inplace=True)


class ResNet18(nn.Module):
    """torchvision's resnet18 layout (same parameters and ops), 10 classes,
    for where torchvision does not import (the CPU torch 2.13 wheel)."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.bn1(self.conv1(x)), inplace=True), 3, 2, 1)
        h = self.layer4(self.layer3(self.layer2(self.layer1(h))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))


def _torchvision(name):
    import torchvision  # noqa: F401  (optional: callers check available())

    return getattr(torchvision.models, name)(weights=None, num_classes=10)


# name -> (make model, make batch(b) -> (inputs, target), loss_fn or None)
MODELS = {
    "mlp": (Mlp, lambda b: (torch.randn(b, 28, 28), torch.randint(0, 10, (b,))), None),
    "cnn": (Cnn, lambda b: (torch.randn(b, 3, 32, 32), torch.randint(0, 10, (b,))), None),
    "gpt": (
        Gpt,
        lambda b: (torch.randint(0, 1024, (b, 128)), torch.randint(0, 1024, (b, 128))),
        gpt_loss,
    ),
    "lstm": (Lstm, lambda b: (torch.randn(b, 32, 28), torch.randint(0, 10, (b,))), None),
    "resnet18": (
        lambda: _torchvision("resnet18"),
        lambda b: (torch.randn(b, 3, 64, 64), torch.randint(0, 10, (b,))),
        None,
    ),
    "resnet18-twin": (
        ResNet18,
        lambda b: (torch.randn(b, 3, 64, 64), torch.randint(0, 10, (b,))),
        None,
    ),
    "mobilenet_v2": (
        lambda: _torchvision("mobilenet_v2"),
        lambda b: (torch.randn(b, 3, 64, 64), torch.randint(0, 10, (b,))),
        None,
    ),
}


def available(name):
    """Whether `name` can be built here (torchvision may be missing)."""
    if name in ("resnet18", "mobilenet_v2"):
        try:
            import torchvision  # noqa: F401
        except ImportError:
            return False
    return name in MODELS


def make(name, batch, seed=0):
    """(model, inputs, target, loss_fn) for `name` at `batch` samples."""
    make_model, make_batch, loss_fn = MODELS[name]
    torch.manual_seed(seed)
    model = make_model()
    inputs, target = make_batch(batch)
    return model, inputs, target, loss_fn


def loss_of(output, target, loss_fn):
    """The loss memfit.profile would compute for this model."""
    if loss_fn is not None:
        return loss_fn(output, target)
    return F.cross_entropy(output, target)


# A Llama small enough to train in a test in milliseconds: 2 layers of width
# 32, 2 heads sharing one key/value head, a vocabulary of 97.
TINY_LLAMA = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)


def tiny_llama(device="cpu", dtype=None, seed=0, **config):
    """An HF LlamaForCausalLM built from TINY_LLAMA (keys of `config`
    replace its values: use_cache=False, vocab_size=16384 ...) on `device`
    ("meta" builds it without memory), in `dtype` (None: fp32), its
    weights drawn after torch.manual_seed(seed). Needs transformers."""
    import transformers

    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(
            transformers.LlamaConfig(**dict(TINY_LLAMA, **config)))
    return model if dtype is None else model.to(dtype)
