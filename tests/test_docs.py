"""The documentation site: an API page per public package, and a strict build that a
broken reference fails (``make test`` builds the whole site with ``mkdocs build
--strict``; these tests build one-page sites on the project's configuration)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pykka_delivery"
# Documented elsewhere: the console script has its guide (docs/cli.md), not an API page.
NOT_API = {"cli"}


def public_modules() -> set[str]:
    """pykka_delivery and each of its top-level packages and modules not named _private."""
    found = {"pykka_delivery"}
    for path in PACKAGE.iterdir():
        name = path.stem
        if name.startswith("_") or name in NOT_API:
            continue
        if (path.is_dir() and (path / "__init__.py").exists()) or path.suffix == ".py":
            found.add(f"pykka_delivery.{name}")
    return found


def exported(module: str) -> set[str]:
    """The names in a module's ``__all__``, read without importing it (pyspark and
    prometheus-client need not be installed)."""
    path = ROOT / module.replace(".", "/")
    source = (path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "__all__":
            return set(ast.literal_eval(node.value))
    return set()


def rendered_modules() -> set[str]:
    """The modules the API pages render (``::: module``), for pages the nav lists."""
    nav = (ROOT / "mkdocs.yml").read_text()
    found = set()
    for page in (ROOT / "docs" / "api").glob("*.md"):
        if f"api/{page.name}" in nav:
            found.update(re.findall(r"^::: ([\w.]+)", page.read_text(), re.MULTILINE))
    return found


def test_every_public_name_of_every_public_package_is_in_the_api_reference() -> None:
    rendered = rendered_modules()
    shown = set().union(*(exported(m) for m in rendered))
    # A module whose names a rendered package re-exports (errors: the root) needs no page.
    missing = {m for m in public_modules() - rendered if not exported(m) <= shown}
    assert missing == set()


def build(tmp_path: Path, page: str) -> subprocess.CompletedProcess[str]:
    """Build a one-page site with the project's configuration (``INHERIT``)."""
    pytest.importorskip("mkdocstrings", reason="the docs tools are in the dev extra")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(page)
    config = tmp_path / "mkdocs.yml"
    config.write_text(
        f"INHERIT: {ROOT / 'mkdocs.yml'}\n"
        f"docs_dir: {docs}\n"
        f"site_dir: {tmp_path / 'site'}\n"
        "nav:\n  - index.md\n"
    )
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "-f", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# A reference resolves to an object rendered on some page of the site.
RENDERED = "::: pykka_delivery.retry\n\n"


@pytest.mark.slow
def test_a_page_with_a_valid_cross_reference_builds(tmp_path: Path) -> None:
    done = build(tmp_path, RENDERED + "See [Backoff][pykka_delivery.retry.Backoff].\n")
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_a_cross_reference_to_a_missing_name_fails_the_build(tmp_path: Path) -> None:
    done = build(tmp_path, RENDERED + "See [gone][pykka_delivery.retry.NoSuchName].\n")
    assert done.returncode != 0
    assert "pykka_delivery.retry.NoSuchName" in done.stderr


@pytest.mark.slow
def test_a_link_to_a_file_outside_the_docs_fails_the_build(tmp_path: Path) -> None:
    done = build(tmp_path, "# Page\n\nSee [the README](../README.md).\n")
    assert done.returncode != 0
    assert "../README.md" in done.stderr
