"""The torch a memfit wheel needs, for scikit-build-core's metadata
([[tool.dynamic-metadata]] in pyproject.toml): exactly the torch it is built
against, so that pip refuses to put the wheel beside another one where it
can (memfit's extension links torch's C++ ABI, which changes between
releases). The source distribution says only torch>=2.4.

The version is the installed distribution's public version (2.14.1, not
2.14.1+cu130): `torch==2.14.1` accepts the CPU and the CUDA wheels of that
release alike, which share the C++ ABI memfit links. The build backend runs in
the Python that builds memfit (pip install --no-build-isolation), so this is
the torch that CMake compiles against (cmake/torch_flags.py).
"""

import sys

__all__ = ["build_state", "dynamic_metadata", "dynamic_wheel", "requirement"]

SDIST_REQUIREMENT = "torch>=2.4"
_state = {"build": "metadata_wheel"}


def requirement() -> str:
    """torch==<the installed torch's public version>."""
    from importlib import metadata

    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        raise RuntimeError(
            f"memfit builds against the torch of the Python that builds it, and "
            f"{sys.executable} has none: install torch>=2.4 there, then run `pip install "
            f"--no-build-isolation .` (without --no-build-isolation pip builds in an empty "
            f"environment)") from None
    return f"torch=={version.split('+')[0]}"


def build_state(state: str) -> None:
    _state["build"] = state


def dynamic_metadata(settings: dict, project: dict) -> dict:
    if settings:
        raise RuntimeError(f"torch_requirement takes no settings, got {sorted(settings)}")
    exact = _state["build"] != "sdist"
    return {"dependencies": [requirement() if exact else SDIST_REQUIREMENT]}


def dynamic_wheel(settings: dict) -> dict:
    """The wheel's requirement differs from the sdist's."""
    return {"dependencies": True}
