"""The process: environment checks, go-plugin's handshake over gRPC with
mutual TLS, the data socket served by uvicorn, JSON logs on stderr.
Plugin protocol 3, sections 1 and 2 (plugins/PROTOCOL.md)."""

from __future__ import annotations

import asyncio
import base64
import ctypes
import datetime
import grp
import json
import logging
import os
import secrets
import socket
import sys
import tempfile
from typing import Any

import grpc
import uvicorn
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ._proto import goplugin_pb2_grpc, health_pb2_grpc
from ._proto import pinned_pb2_grpc as pbg
from .runtime import Broker, Controller, HealthServicer, Host, Runtime

PROTOCOL_VERSION = 3
CORE_PROTOCOL = 1
COOKIE_KEY = "PINNEDD_PLUGIN"
COOKIE_VALUE = "a2f1c7a4-host-plugin"

_LEVELS = {"WARNING": "WARN", "CRITICAL": "ERROR"}
_STD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JSONFormatter(logging.Formatter):
    """One JSON object a line, as pinnedd re-logs them: level, msg and
    every extra as a field."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"level": _LEVELS.get(record.levelname, record.levelname), "msg": record.getMessage()}
        for k, v in vars(record).items():
            if k not in _STD:
                out[k] = v if isinstance(v, (str, int, float, bool)) or v is None else str(v)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def make_cert() -> tuple[bytes, bytes, bytes]:
    """A self-signed certificate as go-plugin makes one: CN and DNS name
    localhost, server and client auth, its own CA. Returns (cert PEM, key
    PEM, cert DER)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost"),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "pinnedd plugin")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(seconds=30)).not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=True,
                                         data_encipherment=False, key_agreement=True, key_cert_sign=True,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .sign(key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return pem, key_pem, cert.public_bytes(serialization.Encoding.DER)


def _non_dumpable() -> None:
    # The data socket's secret and the cluster credential live in this
    # process's memory: another process of the same user must not read
    # them (/proc/<pid>/mem, ptrace). PR_SET_DUMPABLE = 4.
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE)")


def _group_writable(path: str, group: str) -> None:
    gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    os.chown(path, -1, gid)
    os.chmod(path, 0o660)


def serve(hosts: dict[str, Host]) -> None:
    """Runs the plugin for hosts until pinnedd shuts it down. Call it from
    the plugin's main; it does not return."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if os.environ.get("PINNEDD_PLUGIN_DEBUG") else logging.INFO)
    logger = logging.getLogger(os.environ.get("PINNEDD_PLUGIN_NAME", "plugin"))
    if os.environ.get(COOKIE_KEY) != COOKIE_VALUE:
        print("This is a pinnedd host plugin: pinnedd starts it (--plugin /ns=PATH); it is not run by hand.",
              file=sys.stderr)
        sys.exit(1)
    versions = os.environ.get("PLUGIN_PROTOCOL_VERSIONS", "").split(",")
    if str(PROTOCOL_VERSION) not in versions:
        logger.error("pinnedd does not offer plugin protocol %d", PROTOCOL_VERSION, extra={"offered": ",".join(versions)})
        sys.exit(1)
    ppid = os.environ.get("PINNEDD_PARENT_PID")
    if ppid and ppid != str(os.getppid()):
        logger.error("parent pinnedd is gone; exiting", extra={"expected_ppid": ppid, "ppid": os.getppid()})
        sys.exit(1)
    try:
        _non_dumpable()
    except OSError as e:
        logger.warning("could not make the plugin process non-dumpable", extra={"err": str(e)})
    try:
        asyncio.run(_main(hosts, logger))
    except Exception:
        logger.exception("plugin failed")
        sys.exit(1)
    # Threads a host left behind do not keep a stopped plugin alive.
    os._exit(0)


async def _main(hosts: dict[str, Host], logger: logging.Logger) -> None:
    rt = Runtime(hosts, logger)
    cert, key, der = make_cert()
    client_cert = os.environ.get("PLUGIN_CLIENT_CERT", "").encode()
    if not client_cert:
        raise RuntimeError("no PLUGIN_CLIENT_CERT: pinnedd always sends one (AutoMTLS)")
    rt.tls = (cert, key, client_cert)

    # The data socket first: Describe names it, and READY says it serves.
    data_path = os.environ.get("PINNEDD_DATA_SOCKET", "")
    data_server = None
    data_task = None
    if data_path:
        try:
            os.unlink(data_path)  # a stale socket from a crashed predecessor
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(data_path)
        sock.listen(1024)
        rt.secured = True
        rt.socket = data_path
        # Keep-alive outlasts pinnedd's idle pool (90 s), so pinnedd, not the
        # plugin, closes an idle connection: no request races a close.
        config = uvicorn.Config(rt, lifespan="off", log_level="warning", access_log=False,
                                timeout_keep_alive=120, proxy_headers=False, server_header=False, date_header=False)
        data_server = uvicorn.Server(config)
        # pinnedd stops the plugin through Shutdown, not signals.
        data_server.install_signal_handlers = lambda: None
        data_task = asyncio.get_running_loop().create_task(data_server.serve(sockets=[sock]))
        while not data_server.started:
            if data_task.done():
                data_task.result()
            await asyncio.sleep(0.005)

    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
    pbg.add_ControlServicer_to_server(rt, server)  # type: ignore[no-untyped-call]
    goplugin_pb2_grpc.add_GRPCBrokerServicer_to_server(rt.broker, server)  # type: ignore[no-untyped-call]
    goplugin_pb2_grpc.add_GRPCControllerServicer_to_server(Controller(rt), server)  # type: ignore[no-untyped-call]
    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(), server)  # type: ignore[no-untyped-call]
    creds = grpc.ssl_server_credentials([(key, cert)], root_certificates=client_cert, require_client_auth=True)
    sock_dir = os.environ.get("PLUGIN_UNIX_SOCKET_DIR") or tempfile.gettempdir()
    control_path = os.path.join(sock_dir, f"plugin{secrets.token_hex(8)}")
    if server.add_secure_port("unix:" + control_path, creds) == 0:
        raise RuntimeError(f"cannot listen on {control_path}")
    await server.start()
    if group := os.environ.get("PLUGIN_UNIX_SOCKET_GROUP"):
        _group_writable(control_path, group)
    line = f"{CORE_PROTOCOL}|{PROTOCOL_VERSION}|unix|{control_path}|grpc|{base64.b64encode(der).decode().rstrip('=')}"
    sys.stdout.write(line + "\n")
    sys.stdout.flush()

    await rt.shutdown_requested.wait()
    await rt.deactivate_all(0)
    if data_server is not None:
        data_server.should_exit = True
        data_server.force_exit = True
    await server.stop(0.5)
    if data_task is not None:
        try:
            await asyncio.wait_for(data_task, 2)
        except (asyncio.TimeoutError, Exception):
            pass
    try:
        os.unlink(control_path)
    except FileNotFoundError:
        pass
