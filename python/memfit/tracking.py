"""Recording every allocation of a block of code: memfit.track()."""

import contextlib

from . import _memfit


class Tracking:
    """What memfit.track() records: live and peak bytes, and the timeline."""

    def __init__(self):
        self._recorder = _memfit.Recorder()
        self._hooks = []

    @property
    def live_bytes(self):
        """Bytes allocated inside the block and still alive."""
        return self._recorder.live_bytes

    @property
    def peak_bytes(self):
        """The most bytes alive at once since the block began."""
        return self._recorder.peak_bytes

    @property
    def timeline(self):
        """Every allocation and free, with phase, module and op."""
        return self._recorder.timeline

    def phase(self, name, iteration=0):
        """Start the named phase ("forward", "backward", ...)."""
        self._recorder.begin_phase(name, iteration)

    def classify(self, tensor, category):
        """Say what a tensor's memory is: "parameter", "optimizer_state", ..."""
        return self._recorder.classify(tensor, category)

    def watch_modules(self, model):
        """Attribute allocations to module paths ("layer1.0.conv1") while
        `model`'s submodules run their forward."""
        recorder = self._recorder
        for path, module in model.named_modules():
            if not path:
                continue

            def pre(_module, _inputs, path=path):
                recorder.push_module(path, True)

            def post(_module, _inputs, _output):
                recorder.pop_module()

            self._hooks.append(module.register_forward_pre_hook(pre))
            self._hooks.append(module.register_forward_hook(post))

    def stop(self):
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._recorder.stop()


@contextlib.contextmanager
def track(model=None):
    """Record every CPU and meta allocation made inside the block.

        with memfit.track(model) as t:
            model(x).sum().backward()
        t.peak_bytes, t.timeline.breakdown_at_peak()

    With `model`, allocations are attributed to its submodules' paths.
    """
    t = Tracking()
    if model is not None:
        t.watch_modules(model)
    try:
        yield t
    finally:
        t.stop()
