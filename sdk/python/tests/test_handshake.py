"""The process as pinnedd sees it: a real plugin process started with
go-plugin's environment prints the handshake line, serves Control and
health over gRPC with mutual TLS to pinnedd's certificate only, and exits
on the controller's Shutdown; run by hand it says so and exits 1."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from pinnedd_sdk._proto import goplugin_pb2, goplugin_pb2_grpc, health_pb2, health_pb2_grpc
from pinnedd_sdk._proto import pinned_pb2 as pb
from pinnedd_sdk._proto import pinned_pb2_grpc as pbg
from pinnedd_sdk.plugin import make_cert

SRC = str(Path(__file__).resolve().parent.parent / "src")
PLUGIN = textwrap.dedent("""
    from pinnedd_sdk import Handlers, Host, serve
    serve({"/things": Host(new=lambda inst: Handlers(), detached_timeout=3)})
""")


def start(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", PLUGIN], env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin", **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_run_by_hand_refuses() -> None:
    p = start({})
    out, err = p.communicate(timeout=30)
    assert p.returncode == 1
    assert "pinnedd starts it" in err


@pytest.fixture
def plugin():
    cert, key, _ = make_cert()
    with tempfile.TemporaryDirectory() as tmp:
        env = {"PINNEDD_PLUGIN": "a2f1c7a4-host-plugin", "PLUGIN_PROTOCOL_VERSIONS": "3,1,2",
               "PLUGIN_CLIENT_CERT": cert.decode(), "PLUGIN_UNIX_SOCKET_DIR": tmp,
               "PINNEDD_DATA_SOCKET": os.path.join(tmp, "data.sock")}
        p = start(env)
        try:
            yield p, cert, key, tmp
        finally:
            p.kill()
            p.wait()


def test_handshake_and_mutual_tls(plugin) -> None:
    p, cert, key, tmp = plugin
    assert p.stdout is not None
    line = p.stdout.readline().rstrip("\n")
    core, version, network, addr, proto, server_cert = line.split("|")
    assert (core, version, network, proto) == ("1", "3", "unix", "grpc")
    assert os.path.dirname(addr) == tmp
    der = base64.b64decode(server_cert + "=" * (-len(server_cert) % 4))
    assert "=" not in server_cert, "the certificate is base64 without padding"
    server_pem = x509.load_der_x509_certificate(der).public_bytes(serialization.Encoding.PEM)

    opts = [("grpc.ssl_target_name_override", "localhost")]
    creds = grpc.ssl_channel_credentials(root_certificates=server_pem, private_key=key, certificate_chain=cert)
    with grpc.secure_channel("unix:" + addr, creds, options=opts) as ch:
        assert health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="plugin"), timeout=10).status \
            == health_pb2.HealthCheckResponse.SERVING
        d = pbg.ControlStub(ch).Describe(pb.DescribeRequest(socket_secret="s"), timeout=10)
        assert [(h.namespace, h.detached_timeout_ms) for h in d.hosts] == [("/things", 3000)]
        assert d.data_socket == os.path.join(tmp, "data.sock") and d.pid == p.pid

    # Another client certificate than PLUGIN_CLIENT_CERT is refused.
    other_cert, other_key, _ = make_cert()
    bad = grpc.ssl_channel_credentials(root_certificates=server_pem, private_key=other_key, certificate_chain=other_cert)
    with grpc.secure_channel("unix:" + addr, bad, options=opts) as ch:
        with pytest.raises(grpc.RpcError):
            pbg.ControlStub(ch).Health(pb.HealthRequest(), timeout=5)

    with grpc.secure_channel("unix:" + addr, creds, options=opts) as ch:
        goplugin_pb2_grpc.GRPCControllerStub(ch).Shutdown(goplugin_pb2.Empty(), timeout=10)
    assert p.wait(timeout=10) == 0
