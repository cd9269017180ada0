"""Writing output files, with one clear error when the place cannot be written."""

from __future__ import annotations

from pathlib import Path

from .errors import SkalpelError


def write_file(path: Path, content: str | bytes) -> Path:
    """Write text (UTF-8) or bytes to ``path``, creating its folder; return the path."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            path.write_text(content, encoding="utf-8")
        else:
            path.write_bytes(content)
    except OSError as error:
        raise SkalpelError(f"cannot write {path}: {error.strerror or error}") from None
    return path
