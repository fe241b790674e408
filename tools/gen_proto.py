"""Regenerate the checked-in protobuf code under ``pykka_delivery/protocol/``.

For every ``.proto`` file there, protoc (the one bundled with ``grpcio-tools``, pinned
in ``pyproject.toml`` so the output is reproducible) writes ``<name>_pb2.py`` and
``<name>_pb2.pyi``; a ``.proto`` that defines a ``service`` also gets
``<name>_pb2_grpc.py``.

protoc runs from the repository root with ``-I .`` and repository-relative file paths, so
the generated modules are ``pykka_delivery.protocol.<name>_pb2`` and protos that import
each other (``import "pykka_delivery/protocol/delivery.proto";``) produce absolute
imports that work from an installed package.

Usage::

    python tools/gen_proto.py            # rewrite the checked-in files (`make proto`)
    python tools/gen_proto.py --out DIR  # write DIR/pykka_delivery/protocol/... instead
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from importlib import resources
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = Path("pykka_delivery") / "protocol"  # relative to REPO_ROOT

# A top-level `service Name {` declaration, once comments are removed.
_SERVICE = re.compile(r"^\s*service\s+\w+\s*\{", re.MULTILINE)
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


def proto_files() -> list[Path]:
    """Every ``.proto`` under ``pykka_delivery/protocol/``, relative to the repo root."""
    return sorted(p.relative_to(REPO_ROOT) for p in (REPO_ROOT / PROTO_DIR).rglob("*.proto"))


def defines_service(proto: Path) -> bool:
    """Whether ``proto`` (relative to the repo root) declares a gRPC ``service``."""
    text = _COMMENT.sub("", (REPO_ROOT / proto).read_text(encoding="utf-8"))
    return _SERVICE.search(text) is not None


def generated_files(out: Path) -> list[Path]:
    """The files that :func:`generate` writes into ``out``, in a stable order."""
    files: list[Path] = []
    for proto in proto_files():
        stem = out / proto.with_suffix("")
        files += [Path(f"{stem}_pb2.py"), Path(f"{stem}_pb2.pyi")]
        if defines_service(proto):
            files.append(Path(f"{stem}_pb2_grpc.py"))
    return files


def _protoc(args: list[str]) -> None:
    # Imported here so `--help` works without grpcio-tools installed.
    from grpc_tools import protoc  # noqa: PLC0415

    # The well-known types (google/protobuf/*.proto) ship inside grpc_tools.
    well_known = resources.files("grpc_tools") / "_proto"
    argv = ["protoc", "-I", ".", "-I", str(well_known), *args]
    status = protoc.main(argv)
    if status != 0:
        raise SystemExit(f"protoc failed with status {status}: {' '.join(argv)}")


def generate(out: Path) -> list[Path]:
    """Run protoc over every proto, writing under ``out`` (the repo root by default).

    Returns:
        The generated files, as listed by :func:`generated_files`.
    """
    protos = [str(p) for p in proto_files()]
    if not protos:
        raise SystemExit(f"no .proto files under {REPO_ROOT / PROTO_DIR}")
    out.mkdir(parents=True, exist_ok=True)
    out_dir = str(out.resolve())
    # protoc resolves `-I .` and the file paths against the working directory.
    cwd = Path.cwd()
    try:
        os.chdir(REPO_ROOT)
        _protoc([f"--python_out={out_dir}", f"--pyi_out={out_dir}", *protos])
        services = [p for p in protos if defines_service(Path(p))]
        if services:
            _protoc([f"--grpc_python_out={out_dir}", *services])
    finally:
        os.chdir(cwd)
    return generated_files(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO_ROOT,
        help="output root; files go to OUT/pykka_delivery/protocol/ (default: the repo root)",
    )
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
