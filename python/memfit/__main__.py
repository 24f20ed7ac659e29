"""python -m memfit COMMAND ...: the same as the `memfit` command."""

from .command import main

__all__ = []

main()
