"""Small models and synthetic data for bench/peers.py (memfit beside the real
Lightning, accelerate, koila and torch's MemTracker).

Every model here is built from a seed, so each method of a comparison gets an
identical fresh copy. Data come from a fixed pool of samples made outside any
memory tracking (the host's data set); a batch is gathered from the pool, so
the batch itself is allocated where the step runs (on the simulated device),
as a GPU's batch would be after the copy.

The leading underscore keeps bench/run_all.py from running it.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

POOL = 256  # samples in each model's data pool


class Mlp(nn.Module):
    """784-512-512-10 on 28x28 images (memfit's built-in mlp)."""

    def __init__(self, hidden=512):
        super().__init__()
        self.fc1 = nn.Linear(784, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, 10)

    def forward(self, x):
        h = x.flatten(1)
        h = torch.relu(self.fc1(h))
        h = torch.relu(self.fc2(h))
        return self.fc3(h)


class SmallCnn(nn.Module):
    """Three conv + BatchNorm + ReLU stages on 3x32x32 images, 10 classes."""

    def __init__(self, width=16):
        super().__init__()
        w = width
        self.conv1 = nn.Conv2d(3, w, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(w)
        self.conv2 = nn.Conv2d(w, 2 * w, 3, stride=2, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(2 * w)
        self.conv3 = nn.Conv2d(2 * w, 4 * w, 3, stride=2, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(4 * w)
        self.head = nn.Linear(4 * w, 10)

    def forward(self, x):
        h = torch.relu(self.bn1(self.conv1(x)))
        h = torch.relu(self.bn2(self.conv2(h)))
        h = torch.relu(self.bn3(self.conv3(h)))
        return self.head(F.adaptive_avg_pool2d(h, 1).flatten(1))


# The gpt and lstm are bench/_models.py's twins of memfit's built-ins, built
# smaller (see MODELS below).
from memfit.testing.models import Gpt, Lstm, gpt_loss  # noqa: E402


def _classes(n, k=10):
    return torch.randint(0, k, (n,))


class Spec:
    """One model of the comparison: how to build it, its samples, its loss."""

    def __init__(self, name, make_model, sample_x, sample_y, loss_fn=None, note=""):
        self.name, self.make_model = name, make_model
        self.sample_x, self.sample_y = sample_x, sample_y  # n -> tensor of n samples
        self.loss_fn, self.note = loss_fn, note
        self._pool = None

    def model(self, seed=0):
        torch.manual_seed(seed)
        return self.make_model()

    def pool(self):
        """The host's data set: POOL samples, made once, untracked."""
        if self._pool is None:
            g = torch.random.get_rng_state()
            torch.manual_seed(1234)
            self._pool = (self.sample_x(POOL), self.sample_y(POOL))
            torch.random.set_rng_state(g)
        return self._pool

    def batch(self, b, offset=0):
        """A batch of b samples gathered from the pool: a new allocation
        (where this runs), like a batch copied to the device."""
        x, y = self.pool()
        idx = (torch.arange(b) + offset) % POOL
        return x[idx], y[idx]

    def loss(self, output, target):
        if self.loss_fn is not None:
            return self.loss_fn(output, target)
        return F.cross_entropy(output, target)


class PoolDataset(torch.utils.data.Dataset):
    """Map-style data set over a Spec's pool, `length` long: items are views
    of the pool (no copy), so the DataLoader's collate makes the batch, one
    allocation of b samples, like Spec.batch."""

    def __init__(self, spec, length=1 << 15):
        self.x, self.y = spec.pool()
        self.length = length

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        j = i % self.x.shape[0]
        return self.x[j], self.y[j]


def fit_specs():
    """The models of the fit comparison (small: many real steps run)."""
    return {
        "mlp": Spec("mlp", lambda: Mlp(), lambda n: torch.randn(n, 28, 28), _classes,
                    note="784-512-512-10"),
        "cnn": Spec("cnn", lambda: SmallCnn(16), lambda n: torch.randn(n, 3, 32, 32), _classes,
                    note="3 conv+BatchNorm stages, 3x32x32"),
        "gpt": Spec("gpt", lambda: Gpt(layers=2, width=64, heads=4, context=32, vocab=512),
                    lambda n: torch.randint(0, 512, (n, 32)),
                    lambda n: torch.randint(0, 512, (n, 32)), gpt_loss,
                    note="2 layers, width 64, context 32"),
        "lstm": Spec("lstm", lambda: Lstm(64), lambda n: torch.randn(n, 16, 28), _classes,
                     note="2-layer LSTM, hidden 64, 16 steps"),
    }


# --- Hugging Face models from small configs (no weights, no hub) -------------

def _hf_causal_loss(output, target):
    return F.cross_entropy(output.logits.flatten(0, 1), target.flatten())


def _hf_cls_loss(output, target):
    return F.cross_entropy(output.logits, target)


class _HfIds(nn.Module):
    """Calls a Hugging Face model with input_ids only (memfit, MemTracker and
    the plain step pass one positional tensor)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, ids):
        return self.inner(input_ids=ids)


def hf_specs(seq=64, vocab=1000):
    """Small GPT-2, BERT and Llama configs, or {} when transformers is
    missing. Returns (specs, version or the import error)."""
    try:
        import transformers
        from transformers import (BertConfig, BertForSequenceClassification, GPT2Config,
                                  GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM)
    except Exception as e:  # noqa: BLE001 (optional dependency: any import failure)
        return {}, f"not importable: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
    try:
        transformers.logging.set_verbosity_error()
    except Exception:  # noqa: BLE001
        pass
    ids = lambda n: torch.randint(0, vocab, (n, seq))  # noqa: E731
    common = dict(bos_token_id=0, eos_token_id=1, pad_token_id=2)

    def gpt2():
        return _HfIds(GPT2LMHeadModel(GPT2Config(
            n_layer=2, n_embd=128, n_head=4, vocab_size=vocab, n_positions=seq,
            attn_implementation="eager", **common)))

    def bert():
        return _HfIds(BertForSequenceClassification(BertConfig(
            num_hidden_layers=2, hidden_size=128, num_attention_heads=4, intermediate_size=512,
            vocab_size=vocab, max_position_embeddings=seq, num_labels=2,
            attn_implementation="eager", **common)))

    def llama():
        return _HfIds(LlamaForCausalLM(LlamaConfig(
            num_hidden_layers=2, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=344, vocab_size=vocab, max_position_embeddings=seq,
            attn_implementation="eager", **common)))

    specs = {
        "hf-gpt2": Spec("hf-gpt2", gpt2, ids, ids, _hf_causal_loss,
                        note=f"GPT2LMHeadModel 2x128, seq {seq}"),
        "hf-bert": Spec("hf-bert", bert, ids, lambda n: torch.randint(0, 2, (n,)), _hf_cls_loss,
                        note=f"BertForSequenceClassification 2x128, seq {seq}"),
        "hf-llama": Spec("hf-llama", llama, ids, ids, _hf_causal_loss,
                         note=f"LlamaForCausalLM 2x128 (GQA 4/2), seq {seq}"),
    }
    return specs, transformers.__version__
