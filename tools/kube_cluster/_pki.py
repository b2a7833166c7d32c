"""The cluster's certificates and keys (openssl): one CA, the API server's serving
certificate, one client certificate for the components and the admin, the service
account signing key. Made once per cluster home; kept across restarts."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


class PkiError(RuntimeError):
    pass


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise PkiError(f"openssl {' '.join(args[:2])} failed: {result.stderr.strip()}")


def make_pki(pki: Path, api_ips: list[str]) -> None:
    """CA, apiserver (serving for ``api_ips`` and the kubernetes Service names), admin
    client (system:masters), service-account key pair. Does nothing when they exist."""
    if (pki / "admin.crt").exists():
        return
    if shutil.which("openssl") is None:
        raise PkiError("the cluster's certificates are made with openssl: apt-get install openssl")
    pki.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650", "-subj", "/CN=statefleet-kube-ca",
             "-keyout", "ca.key", "-out", "ca.crt", cwd=pki)  # fmt: skip
    names = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"]
    san = ",".join([f"DNS:{n}" for n in names] + [f"IP:{ip}" for ip in api_ips])
    (pki / "apiserver.ext").write_text(
        f"subjectAltName={san}\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
    )
    (pki / "client.ext").write_text("keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n")
    for name, subject, ext in (
        ("apiserver", "/CN=kube-apiserver", "apiserver.ext"),
        ("admin", "/O=system:masters/CN=statefleet-admin", "client.ext"),
    ):
        _openssl(
            "req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=pki
        )
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "3650", "-extfile", ext, "-out", f"{name}.crt", cwd=pki)  # fmt: skip
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    for key in pki.glob("*.key"):
        key.chmod(0o600)
