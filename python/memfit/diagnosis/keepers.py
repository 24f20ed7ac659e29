"""The user's line that keeps a step's tensor alive in a container
(`losses.append(loss)`): not a torch call, so the observer never sees it;
found in the source beside the line that made the tensor."""

from __future__ import annotations

import linecache
import re

from .records import Site

__all__: list = []

# How far below the line that made the tensor the loop body is searched.
_LINES = 40


class Keeper:
    """Where `name`, made at `made`, is put into `container`: `site`."""

    def __init__(self, site: Site, name: str, container: str) -> None:
        self.site, self.name, self.container = site, name, container


def keeper_of(made: Site) -> Keeper | None:
    """The line after `made` (`loss = ...`) that appends the name it assigns
    to a list (`losses.append(loss)`, `losses += [loss]`,
    `history.extend([loss])`), or None."""
    if made.line <= 0 or made.file.startswith("<"):
        return None
    m = re.match(r"\s*([A-Za-z_]\w*)\s*(?::[^=]*)?=(?!=)", linecache.getline(made.file, made.line))
    if m is None:
        return None
    name = m.group(1)
    keeps = re.compile(
        rf"([A-Za-z_][\w.]*)\s*(?:\.append\(\s*{name}\s*\)|\+=\s*\[\s*{name}\s*\]|"
        rf"\.extend\(\s*\[\s*{name}\s*\]\s*\))")
    for line in range(made.line + 1, made.line + 1 + _LINES):
        text = linecache.getline(made.file, line)
        if not text:
            break
        hit = keeps.search(text)
        if hit:
            return Keeper(Site(made.file, line, made.function), name, hit.group(1))
    return None
