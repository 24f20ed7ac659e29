"""Models for trying memfit out and for tests: Python twins of the C++
command's built-in models (mlp, cnn, gpt, lstm, resnet18), with synthetic
batches (memfit.testing.models.make("gpt", batch=8)); and a truth that is
not memfit's own, plain training steps on the simulated device
(memfit.testing.truth); and cases run on spawned gloo ranks, for what
every rank must agree on (memfit.testing.spawned_ranks); and the log a
fit-corpus run prints and CI's gate reads (memfit.testing.corpus_log)."""

__all__: list = []
