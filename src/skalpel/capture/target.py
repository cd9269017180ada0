"""What ``skalpel run`` (and ``skalpel tune``'s window runs) execute: a script or a module, as ``python`` would.

``check_target`` turns a missing script or a syntax error into one line before anything
starts; ``as_main`` sets ``sys.argv`` and ``sys.path[0]`` as the interpreter does; and
``exit_status`` reads a ``SystemExit`` the way the interpreter would. No torch here:
``skalpel tune`` checks its script with it before any run.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import SkalpelError


@dataclass(frozen=True)
class Target:
    """A script path or a module name (``-m``), and the arguments it is given."""

    name: str
    args: tuple[str, ...] = ()
    module: bool = False

    @property
    def label(self) -> str:
        return self.name.rsplit(".", 1)[-1] if self.module else Path(self.name).stem


def check_target(target: Target) -> Path:
    """The file that will run; a one-line SkalpelError when it is missing or does not compile."""
    if target.module:
        sys.path.insert(0, str(Path.cwd()))  # as python -m does
        try:
            spec = importlib.util.find_spec(target.name)
        except (ImportError, ValueError) as error:
            raise SkalpelError(f"cannot find module {target.name!r}: {error}") from None
        finally:
            del sys.path[0]
        if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
            raise SkalpelError(f"no module named {target.name!r} (on sys.path, from {Path.cwd()})")
        if spec.submodule_search_locations is not None:  # a package: python -m runs its __main__
            main = Path(spec.origin).with_name("__main__.py")
            if not main.is_file():
                raise SkalpelError(f"{target.name!r} is a package without __main__.py; it cannot be run with -m")
            path = main
        else:
            path = Path(spec.origin)
    else:
        path = Path(target.name)
        if not path.exists():
            raise SkalpelError(f"no such script: {target.name}")
        if not path.is_file():
            raise SkalpelError(f"not a script file: {target.name}")
    if path.suffix == ".py":
        check_compiles(path)
    return path


def check_compiles(path: Path) -> None:
    """A one-line SkalpelError when ``path`` cannot be read or does not compile."""
    try:
        source = path.read_bytes()
    except OSError as error:
        raise SkalpelError(f"cannot read {path}: {error.strerror or error}") from None
    try:
        compile(source, str(path), "exec")
    except SyntaxError as error:
        raise SkalpelError(f"syntax error in {path}, line {error.lineno}: {error.msg}") from None
    except ValueError as error:  # null bytes
        raise SkalpelError(f"cannot compile {path}: {error}") from None


def exit_status(exit_: SystemExit) -> int:
    """The status ``python SCRIPT`` would end with after ``sys.exit(code)`` (a message is printed, as python does)."""
    code = exit_.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


class as_main:
    """``sys.argv``, ``sys.path[0]`` as ``python SCRIPT`` (or ``python -m MODULE``) sets them; restored after."""

    def __init__(self, target: Target, path: Path) -> None:
        self.argv = [str(path) if target.module else target.name, *target.args]
        self.path0 = str(Path.cwd()) if target.module else str(path.resolve().parent)

    def __enter__(self) -> None:
        self.saved_argv, self.saved_path = sys.argv, list(sys.path)
        sys.argv = list(self.argv)
        sys.path[:1] = [self.path0]  # python puts the script's folder (with -m: the current one) first

    def __exit__(self, *exc: object) -> None:
        sys.argv = self.saved_argv
        sys.path[:] = self.saved_path
