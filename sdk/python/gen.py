"""Regenerates the SDK's gRPC stubs (src/pinnedd_sdk/_proto) from the
protocol's .proto files: plugins/proto/pinned.proto (the repository's one
source of the pinnedd protocol) and proto/*.proto (go-plugin's and gRPC
health's wire types).

    /usr/bin/python3 sdk/python/gen.py          # rewrite the stubs
    /usr/bin/python3 sdk/python/gen.py --check  # exit 1 if they are stale

Needs protoc 3.15+ and grpc_python_plugin (Debian: protobuf-compiler and
protobuf-compiler-grpc; Debian's python3-grpc-tools bundles protoc 3.5,
too old for pinned.proto's proto3 `optional`). The stubs are committed so
that installing the SDK needs no protoc; tests/test_stubs.py fails when
they no longer match the .proto files.
"""

from __future__ import annotations

import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
OUT = HERE / "src" / "pinnedd_sdk" / "_proto"
SOURCES = [REPO / "plugins" / "proto" / "pinned.proto", *sorted((HERE / "proto").glob("*.proto"))]
PKG = Path("pinnedd_sdk") / "_proto"


def generate(dest: Path) -> list[str]:
    """Writes the stubs into dest and returns their file names."""
    with tempfile.TemporaryDirectory() as tmp:
        # The .proto files sit under the package path so that the stubs
        # import each other as pinnedd_sdk._proto.<name>_pb2.
        tree = Path(tmp) / PKG
        tree.mkdir(parents=True)
        for src in SOURCES:
            shutil.copyfile(src, tree / src.name)
        plugin = shutil.which("grpc_python_plugin")
        if plugin is None:
            raise SystemExit("grpc_python_plugin not found (Debian: protobuf-compiler-grpc)")
        args = ["protoc", f"--plugin=protoc-gen-grpc_python={plugin}", f"-I{tmp}",
                f"--python_out={tmp}", f"--pyi_out={tmp}", f"--grpc_python_out={tmp}"]
        args += [str(PKG / s.name) for s in SOURCES]
        subprocess.run(args, check=True)
        names = sorted(p.name for p in tree.glob("*_pb2*.py*"))
        dest.mkdir(parents=True, exist_ok=True)
        for n in names:
            shutil.copyfile(tree / n, dest / n)
    return names


def stale() -> list[str]:
    """Names of stubs that differ from what the .proto files generate."""
    with tempfile.TemporaryDirectory() as tmp:
        names = generate(Path(tmp))
        return [n for n in names if not (OUT / n).exists() or not filecmp.cmp(Path(tmp) / n, OUT / n, shallow=False)]


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        bad = stale()
        if bad:
            print("stale stubs (run /usr/bin/python3 sdk/python/gen.py):", ", ".join(bad))
            sys.exit(1)
    else:
        for n in generate(OUT):
            print(OUT / n)
