"""The framework versions the integrations were tested with: outside them, a clear message, not a traceback."""

from __future__ import annotations

from importlib import metadata

from ..errors import SkalpelError


def _release(text: str) -> tuple[int, ...]:
    """The numeric release of a version string (``2.6.0rc1`` -> (2, 6, 0)); the rest is ignored."""
    parts: list[int] = []
    for piece in text.split("+")[0].split("."):
        digits = ""
        for char in piece:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            break
        parts.append(int(digits))
        if digits != piece:
            break
    return tuple(parts)


def check_version(what: str, distributions: tuple[str, ...], low: str, high: str, extra: str) -> str:
    """The installed version of the first of ``distributions`` found; a SkalpelError naming every one tried when none
    is installed or the one found is outside [low, high) (``high`` excluded)."""
    tried: list[str] = []
    for name in distributions:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            tried.append(f"{name} (not installed)")
            continue
        if _release(low) <= _release(version) < _release(high):
            return version
        tried.append(f"{name} {version}")
    raise SkalpelError(
        f"skalpel's {what} integration is tested with {what} >={low},<{high}; found: {', '.join(tried)}. "
        f"Install a tested version (pip install 'skalpel[{extra}]') or run the script under `skalpel run`, "
        f"which needs no integration"
    )
