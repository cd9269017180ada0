"""A framework outside the tested range: a message naming every version tried, not a traceback."""

from __future__ import annotations

from importlib import metadata

import pytest

from skalpel.errors import SkalpelError
from skalpel.integrations.versions import _release, check_version


def test_installed_version_outside_the_range_is_named() -> None:
    installed = metadata.version("numpy")  # any distribution that is installed
    with pytest.raises(SkalpelError) as raised:
        check_version("NumPy", ("no-such-dist-skalpel", "numpy"), "0.1", "0.2", "hf")
    message = str(raised.value)
    assert f"numpy {installed}" in message and "no-such-dist-skalpel (not installed)" in message
    assert ">=0.1,<0.2" in message and "skalpel[hf]" in message


def test_version_inside_the_range_is_returned() -> None:
    installed = metadata.version("numpy")
    assert check_version("NumPy", ("numpy",), "1", "999", "hf") == installed


@pytest.mark.parametrize("text, release", [("2.6.0", (2, 6, 0)), ("5.0.0rc1", (5, 0, 0)), ("2.13.0+cpu", (2, 13, 0)),
                                           ("4.57.1.dev0", (4, 57, 1))])  # fmt: skip
def test_release(text: str, release: tuple) -> None:
    assert _release(text) == release
