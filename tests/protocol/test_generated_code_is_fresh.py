"""The checked-in protobuf code is what tools/gen_proto.py makes from the .proto files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTOCOL_DIR = Path("pykka_delivery") / "protocol"
STALE = "generated code is stale: run `make proto`"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def _generated_under(root: Path) -> list[Path]:
    return sorted(
        path.relative_to(root)
        for path in (root / PROTOCOL_DIR).rglob("*")
        if path.is_file() and path.name.endswith(GENERATED_SUFFIXES)
    )


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gen_proto")
    subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / "gen_proto.py"), "--out", str(out)],
        check=True,
        capture_output=True,
        text=True,
    )
    return out


def test_every_proto_has_its_generated_files_checked_in(fresh: Path) -> None:
    assert _generated_under(fresh), "gen_proto.py generated nothing"
    assert _generated_under(REPO_ROOT) == _generated_under(fresh), STALE


def test_checked_in_generated_files_match_the_proto_files(fresh: Path) -> None:
    for relative in _generated_under(fresh):
        checked_in = REPO_ROOT / relative
        assert checked_in.is_file(), f"{relative} is missing; {STALE}"
        assert checked_in.read_bytes() == (fresh / relative).read_bytes(), (
            f"{relative} differs; {STALE}"
        )
