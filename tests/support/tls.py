"""A certificate authority of the test's own and a server certificate it signed, made with the
``openssl`` command, for the W&B test backend's HTTPS mode.

A client trusts it through ``SSL_CERT_FILE`` (Go's crypto/x509 and OpenSSL both read it: the
wandb-core process and Python's ``ssl``), with no change to the machine's trust store.
"""

from __future__ import annotations

import ipaddress
import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Certificate:
    ca: Path  # the authority's certificate: what a client trusts (SSL_CERT_FILE)
    cert: Path  # the server's, for ``names``
    key: Path

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self.key)
        return context

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))


def unsupported() -> str | None:
    return None if shutil.which("openssl") else "the HTTPS tests need the openssl command"


def make_certificate(folder: Path, *names: str) -> Certificate:
    """An authority and a certificate for ``names`` (host names or IP addresses), valid 2 days."""
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key = folder / "ca.pem", folder / "ca.key"
    cert, key, csr, ext = folder / "server.pem", folder / "server.key", folder / "server.csr", folder / "server.ext"
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        "req", "-x509", *ec, "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", "/CN=ray_wandb_nodes test CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    _openssl("req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=wandb test backend")
    sans = ",".join(f"IP:{n}" if _is_ip(n) else f"DNS:{n}" for n in names)
    ext.write_text(
        f"subjectAltName={sans}\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\n"
    )
    _openssl(
        "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert, "-days", "2",
        "-extfile", ext,
    )  # fmt: skip
    return Certificate(ca, cert, key)


def _openssl(*args: object) -> None:
    out = subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(map(str, args))}: {out.stderr.strip()}")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False
