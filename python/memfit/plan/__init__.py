"""Planning on a measured step: the largest batch that fits (fit), the
strategies that lower the peak (advise, strategies) and what they cost in
time (cost)."""

__all__: list = []
