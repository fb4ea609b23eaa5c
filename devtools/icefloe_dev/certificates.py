"""A private certificate authority for the local broker's TLS listeners, made with the system's `openssl` (Debian's).

`PrivateCa(directory)` writes `ca.pem`/`ca.key`; `server(name)` a broker certificate for 127.0.0.1 and localhost;
`client(name, password=...)` a client certificate whose key is unencrypted, or encrypted as openssl 3 writes it by
default (PKCS#8 with PBES2/AES-256), or as PBES1 (`legacy=True`); `expired=True` one whose validity ended yesterday
(openssl 3.0's `x509` cannot date a certificate in the past: `cryptography` signs that one). Each is a `Pem` of file
paths and their text.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .processes import ServiceError

DAYS = "2"


@dataclass(frozen=True)
class Pem:
    certificate: Path
    key: Path

    @property
    def certificate_text(self) -> str:
        return self.certificate.read_text()

    @property
    def key_text(self) -> str:
        return self.key.read_text()


def _openssl(*args: str, cwd: Path) -> None:
    found = shutil.which("openssl")
    if found is None:
        raise ServiceError("openssl is needed to make the test certificates (Debian: apt-get install openssl)")
    done = subprocess.run([found, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise ServiceError(f"openssl {args[0]} failed: {done.stderr.strip()}")


class PrivateCa:
    """A self-signed CA under `directory` that signs server and client certificates."""

    def __init__(self, directory: Path, name: str = "icefloe test CA"):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.pem = Pem(self.directory / "ca.pem", self.directory / "ca.key")
        _openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", DAYS, "-subj", f"/CN={name}",
            "-keyout", str(self.pem.key), "-out", str(self.pem.certificate),
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            cwd=self.directory,
        )  # fmt: skip

    @property
    def certificate(self) -> Path:
        return self.pem.certificate

    def _signed(self, name: str, extensions: str) -> Pem:
        key, request, cert = (self.directory / f"{name}.{suffix}" for suffix in ("key", "csr", "pem"))
        ext = self.directory / f"{name}.ext"
        ext.write_text(extensions)
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", str(key), "-out",
                 str(request), cwd=self.directory)  # fmt: skip
        _openssl("x509", "-req", "-in", str(request), "-CA", str(self.pem.certificate), "-CAkey", str(self.pem.key),
                 "-CAcreateserial", "-days", DAYS, "-extfile", str(ext), "-out", str(cert), cwd=self.directory)  # fmt: skip
        return Pem(cert, key)

    def _backdate(self, certificate: Path) -> None:
        import datetime

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization

        issued = x509.load_pem_x509_certificate(certificate.read_bytes())
        ca = x509.load_pem_x509_certificate(self.pem.certificate.read_bytes())
        ca_key = serialization.load_pem_private_key(self.pem.key.read_bytes(), None)
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(issued.subject)
            .issuer_name(ca.subject)
            .public_key(issued.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=3))
            .not_valid_after(now - datetime.timedelta(days=1))
        )
        for extension in issued.extensions:
            builder = builder.add_extension(extension.value, extension.critical)
        signed = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]  # the CA's key is RSA
        certificate.write_bytes(signed.public_bytes(serialization.Encoding.PEM))

    def server(self, name: str = "broker") -> Pem:
        """A server certificate for 127.0.0.1 and localhost (the names clients check)."""
        return self._signed(name, "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")

    def client(self, name: str, password: str | None = None, legacy: bool = False, expired: bool = False) -> Pem:
        """A client certificate; with `password` its key is encrypted (PBES2 as openssl 3 writes it, or PBES1 with
        `legacy`); `expired`: valid from three days ago until yesterday."""
        pem = self._signed(name, "extendedKeyUsage=clientAuth\n")
        if expired:
            self._backdate(pem.certificate)
        if password is None:
            return pem
        encrypted = self.directory / f"{name}.enc.key"
        scheme = ["-v1", "PBE-SHA1-3DES"] if legacy else ["-v2", "aes-256-cbc"]
        _openssl("pkcs8", "-topk8", "-in", str(pem.key), "-out", str(encrypted), *scheme, "-passout",
                 f"pass:{password}", cwd=self.directory)  # fmt: skip
        return Pem(pem.certificate, encrypted)
