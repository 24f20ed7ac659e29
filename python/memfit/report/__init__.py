"""Where a step's memory goes: memfit.profile, the Report it returns, what
one rank needs under data parallelism, and the HTML page."""

__all__: list = []
