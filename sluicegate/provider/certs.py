"""A throwaway CA and a server certificate it signed, for a TLS mock provider.

Tests, benchmarks and drills need a provider that speaks TLS and a CA file the
gateway can verify it with; the openssl command makes both in a directory.
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TestCertificates:
    ca: Path  # trust this (a provider's tls.ca_file)
    cert: Path  # serve these (the mock's --tls-cert / --tls-key)
    key: Path


def _san(name: str) -> str:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return f"DNS:{name}"
    return f"IP:{name}"


def make_test_ca(directory: Path, server_names: Sequence[str]) -> TestCertificates:
    """A P-256 CA valid for a day and a server certificate for `server_names` (DNS names or
    IP addresses, all in subjectAltName). Raises RuntimeError without the openssl command."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("making a test CA needs the openssl command (Debian package openssl)")
    ca_key, ca_cert = directory / "ca.key", directory / "ca.pem"
    key, csr, cert = directory / "server.key", directory / "server.csr", directory / "server.pem"
    extensions = directory / "server.ext"
    extensions.write_text(
        f"subjectAltName={','.join(_san(name) for name in server_names)}\n"
        "extendedKeyUsage=serverAuth\n"
        "basicConstraints=critical,CA:FALSE\n"
    )

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, timeout=30)

    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    run("req", "-x509", *curve, "-days", "1", "-subj", "/CN=sluicegate test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout", str(ca_key), "-out", str(ca_cert))  # fmt: skip
    run("req", *curve, "-subj", f"/CN={server_names[0]}", "-keyout", str(key), "-out", str(csr))
    run("x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key),
        "-CAcreateserial", "-days", "1", "-extfile", str(extensions),
        "-out", str(cert))  # fmt: skip
    return TestCertificates(ca_cert, cert, key)
