"""A real OCI registry on 127.0.0.1 for the tests: CNCF Distribution built from its Go module by
scripts/build-registry (cached by version), serving TLS with a CA made here and htpasswd (bcrypt)
authentication, storing blobs in a folder the tests can reach into (to damage one). The ORAS CLI
beside it is what kimideploy pushes and pulls with.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO
from tests.go_builds import wait_for_go_builds
from tests.ports import free_port as _free_port


class UnavailableError(RuntimeError):
    """The registry or ORAS could not be built here; the tests that need them say why."""


def binaries() -> tuple[Path, Path]:
    """(registry, oras), built when missing."""
    wait_for_go_builds()
    done = subprocess.run([str(REPO / "scripts" / "build-registry")], capture_output=True,
                          text=True, timeout=1800)  # fmt: skip
    if done.returncode != 0:
        raise UnavailableError(done.stderr.strip()[-2000:])
    registry, oras = done.stdout.strip().splitlines()[-2:]
    return Path(registry), Path(oras)


def _certificate(where: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 signed by it: (ca.crt, server.crt, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kimideploy test registry CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    server = (x509.CertificateBuilder()
              .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
              .issuer_name(ca_name).public_key(key.public_key())
              .serial_number(x509.random_serial_number())
              .not_valid_before(now - datetime.timedelta(minutes=5))
              .not_valid_after(now + datetime.timedelta(days=1))
              .add_extension(x509.SubjectAlternativeName(
                  [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
              .sign(ca_key, hashes.SHA256()))  # fmt: skip
    pem = serialization.Encoding.PEM
    (where / "ca.crt").write_bytes(ca.public_bytes(pem))
    (where / "server.crt").write_bytes(server.public_bytes(pem))
    (where / "server.key").write_bytes(key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))  # fmt: skip
    return where / "ca.crt", where / "server.crt", where / "server.key"


def docker_config(host: str, user: str, password: str) -> str:
    """What a kubernetes.io/dockerconfigjson Secret holds (and ORAS reads)."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return json.dumps({"auths": {host: {"auth": token}}})


@dataclass
class TestRegistry:
    host: str
    storage: Path
    ca: Path
    oras: Path
    user: str
    password: str
    process: subprocess.Popen[bytes]
    log: Path

    def credentials(self, where: Path, password: str | None = None) -> Path:
        """A dockerconfigjson file, as the mounted Secret would be (a wrong `password` for the
        refusal cases)."""
        where.mkdir(parents=True, exist_ok=True)
        path = where / ".dockerconfigjson"
        path.write_text(docker_config(self.host, self.user, password or self.password))
        return path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)

    def blob_files(self) -> list[Path]:
        return sorted(self.storage.rglob("blobs/sha256/*/*/data"))


def start(where: Path) -> TestRegistry:
    """The registry on a free 127.0.0.1 port, ready when this returns."""
    import bcrypt

    registry, oras = binaries()
    where.mkdir(parents=True, exist_ok=True)
    ca, cert, key = _certificate(where)
    user, password = "kimideploy-ci", base64.b32encode(os.urandom(10)).decode().lower()
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=5)).decode()
    (where / "htpasswd").write_text(f"{user}:{hashed}\n")
    port = _free_port()
    config = {
        "version": 0.1,
        "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": str(where / "storage")}, "delete": {"enabled": True}},
        "http": {"addr": f"127.0.0.1:{port}", "secret": os.urandom(16).hex(),
                 "tls": {"certificate": str(cert), "key": str(key)}},
        "auth": {"htpasswd": {"realm": "kimideploy-test", "path": str(where / "htpasswd")}},
    }  # fmt: skip
    (where / "config.yml").write_text(json.dumps(config))  # JSON is YAML
    log = where / "registry.log"
    process = subprocess.Popen([str(registry), "serve", str(where / "config.yml")],
                               stdout=log.open("wb"), stderr=subprocess.STDOUT)  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise UnavailableError(f"the registry exited: {log.read_text()[-2000:]}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.2)
    else:
        process.kill()
        raise UnavailableError("the registry did not listen within 30 s")
    return TestRegistry(f"127.0.0.1:{port}", where / "storage", ca, oras, user, password,
                        process, log)  # fmt: skip
