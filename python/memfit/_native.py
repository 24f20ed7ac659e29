"""The compiled extension, memfit._memfit, reached through this one module at
the bottom of the package: every other module writes
`from .._native import native as _memfit`, or takes a name listed here
(`from .._native import format_bytes`), so that none imports the package's
__init__ to reach it and memfit/__init__.py stays the top of the imports.

The extension lies beside this file, in memfit/, both in the build tree
(build/python/memfit) and in an installed wheel. The bindings are documented
where they are defined, in python/src."""

from . import _memfit as native
from ._memfit import (
    ChunkCoverage,
    ChunkSchedule,
    allocation_id,
    allocator_figures,
    budget,
    format_bytes,
    parse_size,
    tracked_live_bytes,
)

__all__ = ["format_bytes", "parse_size"]
