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
    """Where `name`, made at `made`, is put into `container`: `site`;
    `detached`: as `name.detach()` (without the graph behind it); `key`:
    stored at a key (`container[key] = name`), else appended."""

    def __init__(self, site: Site, name: str, container: str, detached: bool = False,
                 key: str = "") -> None:
        self.site, self.name, self.container = site, name, container
        self.detached, self.key = detached, key

    def keeping(self, value: str) -> str:
        """The line keeping `value` instead: `losses.append(value)`."""
        if self.key:
            return f"{self.container}[{self.key}] = {value}"
        return f"{self.container}.append({value})"


def keeper_of(made: Site) -> Keeper | None:
    """The line after `made` (`loss = ...`) that appends the name it assigns
    to a list (`losses.append(loss)`, `losses += [loss]`,
    `history.extend([loss])`, `.append((loss, y))`) or stores it at a key
    (`history[i] = loss`); `loss.detach()`, `.clone()` or `.data` of it
    too; or None."""
    if made.line <= 0 or made.file.startswith("<"):
        return None
    m = re.match(r"\s*([A-Za-z_]\w*)\s*(?::[^=]*)?=(?!=)", linecache.getline(made.file, made.line))
    if m is None:
        return None
    # The name, or a copy that shares its storage or the step's bytes.
    name = m.group(1)
    v = rf"{name}((?:\.detach\(\)|\.clone\(\)|\.data)*)"
    # In a tuple too (`.append((out, y))`), or stored at a key (`d[i] = out`).
    t = rf"\(\s*(?:[^()]*,\s*)?{v}\s*(?:,[^()]*)?\)"
    keeps = re.compile(
        rf"([A-Za-z_][\w.]*)\s*(?:\.append\(\s*(?:{v}|{t})\s*\)|\+=\s*\[\s*{v}\s*\]|"
        rf"\.extend\(\s*\[\s*{v}\s*\]\s*\)|\[[^\]]*\]\s*=\s*{v}\s*(?:#.*)?$)")
    for line in range(made.line + 1, made.line + 1 + _LINES):
        text = linecache.getline(made.file, line)
        if not text:
            break
        hit = keeps.search(text)
        if hit:
            chain = next((g for g in hit.groups()[1:] if g is not None), "")
            key = re.match(r"[\w.]*\s*\[([^\]]*)\]", hit.group(0))
            return Keeper(Site(made.file, line, made.function), name, hit.group(1),
                          detached=".detach()" in chain or ".data" in chain,
                          key=key.group(1).strip() if key else "")
    return None
