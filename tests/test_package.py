"""What the package says of itself."""

from __future__ import annotations

from importlib.metadata import version

import pykka_delivery


def test_the_package_says_its_installed_version() -> None:
    assert pykka_delivery.__version__ == version("pykka-delivery") == "0.1.0"
