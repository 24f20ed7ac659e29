"""memfit.lazy: record a computation on a batch, run it in chunks that fit.

    api      lazy(), eager(), last_lazy_run()
    tensor   the LazyTensor and the nn.Module call hook
    graph    recording: the graph of Nodes and what the probes learn
    run      running a recorded graph in chunks: sizing, backward, values

The package is not named `lazy`: memfit.lazy is the function."""

__all__: list = []
