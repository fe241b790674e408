"""README's snippets are true: each runs as written, or is an excerpt of a tested program.

A ```python block of README.md is either

* a whole one-process program: it is run here, as written, in a fresh interpreter in an
  empty directory (it must import what it uses and end on its own); or
* part of a multi-process set-up: its first line is ``# From examples/<name>.py ...``,
  every code line of the block appears in that program, and a test runs that program
  (a test file names it, or a program beside it that a test file names starts it).

So a snippet cannot drift from code that works, nor leave its reader guessing a name.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
EXCERPT = re.compile(r"^# From (examples/\S+\.py)\b")


def python_blocks() -> list[tuple[int, str]]:
    """(line number, code) of every ```python block of README.md."""
    blocks: list[tuple[int, str]] = []
    lines = README.read_text(encoding="utf-8").splitlines()
    start: int | None = None
    for number, line in enumerate(lines, 1):
        if start is None and line.strip() == "```python":
            start = number
        elif start is not None and line.strip() == "```":
            blocks.append((start, "\n".join(lines[start : number - 1]) + "\n"))
            start = None
    return blocks


BLOCKS = python_blocks()
WHOLE = [(line, code) for line, code in BLOCKS if not EXCERPT.match(code)]
EXCERPTS = [(line, code) for line, code in BLOCKS if EXCERPT.match(code)]


def test_readme_has_both_kinds_of_snippet() -> None:
    assert len(WHOLE) >= 3
    assert len(EXCERPTS) >= 3


@pytest.mark.slow
@pytest.mark.parametrize(("line", "code"), WHOLE, ids=[f"README.md:{n}" for n, _ in WHOLE])
def test_a_whole_snippet_runs_as_written(line: int, code: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, f"README.md:{line} failed:\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr


def code_lines(code: str) -> list[str]:
    """The block's lines that are code: stripped, without comments or blank lines."""
    out = []
    for raw in code.splitlines():
        line = raw.split("  # ", 1)[0].strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


@pytest.mark.parametrize(("line", "code"), EXCERPTS, ids=[f"README.md:{n}" for n, _ in EXCERPTS])
def test_an_excerpt_is_part_of_a_program_a_test_runs(line: int, code: str) -> None:
    match = EXCERPT.match(code)
    assert match is not None
    program = ROOT / match.group(1)
    assert program.is_file(), f"README.md:{line} names {program}, which does not exist"
    source = {raw.split("  # ", 1)[0].strip() for raw in program.read_text().splitlines()}
    missing = [c for c in code_lines(code) if c not in source]
    assert not missing, f"README.md:{line}: not in {match.group(1)}: {missing}"
    assert runs(match.group(1)), f"no test runs {match.group(1)} (README.md:{line})"


def code_strings(path: Path) -> str:
    """The string literals of ``path``'s code, one per line: not its comments, nor its
    docstrings (a file that only mentions a program does not run it)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, documented)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return "\n".join(
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    )


def runs(program: str) -> bool:
    """A test runs ``program``: a test's code names it, or it is started (its file name
    in the code) by a program of its directory that a test's code names."""
    tests = "\n".join(code_strings(p) for p in (ROOT / "tests").rglob("test_*.py"))
    if program in tests:
        return True
    path = ROOT / program
    return any(
        str(other.relative_to(ROOT)) in tests and path.name in code_strings(other)
        for other in path.parent.glob("*.py")
        if other != path
    )
