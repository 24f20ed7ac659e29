"""The mechanics under every memfit call: running the user's training step on
the side, recording its allocations, and putting the user's state back.

Internal: the public names (track, Tracking, simulated_device, offload, ...)
are re-exported by memfit itself."""

__all__: list = []
