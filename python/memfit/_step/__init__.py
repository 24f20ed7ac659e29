"""The mechanics under every memfit call: running the user's training step on
the side, recording its allocations, and putting the user's state back.

Internal: the public names made of it (simulated_device, track, offload and
the classes under them) are memfit.memory's; a trainer's integration uses
memfit.integrations (its api module), not these."""

__all__: list = []
