"""Models for trying memfit out and for tests: Python twins of the C++
command's built-in models (mlp, cnn, gpt, lstm, resnet18), with synthetic
batches (memfit.testing.models.make("gpt", batch=8))."""

__all__: list = []
