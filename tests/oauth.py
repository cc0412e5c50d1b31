"""Bearer tokens against Azurite: a self-signed certificate for its HTTPS, and
tokens its ``--oauth basic`` takes (it checks their claims, not a signature).
The fixtures that start such an Azurite are in ``tests/conftest.py``."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json
import time
import uuid
from pathlib import Path
from typing import Any

from azure.core.credentials import AccessToken

__all__ = ["Issuer", "certificate", "jwt"]


def certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own authority), and its key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert, private = directory / "cert.pem", directory / "key.pem"
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    return cert, private


def jwt(lifetime: float) -> str:
    """A token Azurite's basic OAuth takes: it checks the claims, not the signature."""

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    now = int(time.time())
    claims = {
        "aud": "https://storage.azure.com",
        "iss": f"https://sts.windows.net/{uuid.uuid4()}/",
        "iat": now,
        "nbf": now - 60,
        "exp": int(now + lifetime),
    }
    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims)}."


class Issuer:
    """A ``TokenCredential`` that counts its tokens; each lives ``lifetime`` seconds."""

    def __init__(self, lifetime: float) -> None:
        self.lifetime = lifetime
        self.scopes: list[tuple[str, ...]] = []
        self.issued: list[str] = []

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        self.scopes.append(scopes)
        self.issued.append(jwt(self.lifetime))
        return AccessToken(self.issued[-1], int(time.time() + self.lifetime))


def bearer_client(kind: Any, azurite: Any, table: str) -> tuple[Issuer, Any]:
    """A table client of ``kind`` on the OAuth Azurite's HTTPS endpoint, with
    the issuer of its bearer tokens (to look for them in what it leaves)."""
    assert azurite.https is not None
    issuer = Issuer(lifetime=3600)
    verify = str(azurite.https[0])
    return issuer, kind(azurite.endpoint, table, credential=issuer, connection_verify=verify)
