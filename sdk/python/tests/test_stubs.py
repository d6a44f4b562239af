"""The committed gRPC stubs match the .proto files they come from."""

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import gen  # noqa: E402


def test_stubs_are_fresh() -> None:
    if shutil.which("protoc") is None or shutil.which("grpc_python_plugin") is None:
        pytest.fail("protoc and grpc_python_plugin are needed (Debian: protobuf-compiler protobuf-compiler-grpc)")
    assert gen.stale() == [], "regenerate with /usr/bin/python3 sdk/python/gen.py"
