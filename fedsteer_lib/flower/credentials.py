"""Credentials for a secure local Flower federation: TLS certificates and SuperNode keys.

    python -m fedsteer_lib.flower.credentials --nodes 3 [--out .]

writes, under `--out`:

- `certificates/ca.crt` (a self-signed certificate authority), `certificates/server.pem` and
  `certificates/server.key` (the SuperLink's certificate, signed by that CA, for 127.0.0.1 and
  localhost): the SuperLink serves TLS with them (`--ssl-ca-certfile`, `--ssl-certfile`,
  `--ssl-keyfile`), and SuperNodes and the `flwr` CLI trust it through `ca.crt`
  (`--root-certificates`, `root-certificates` in the connection);
- `keys/supernode-<i>` and `keys/supernode-<i>.pub` for i < nodes: each SuperNode's ECDSA P-384
  key pair in OpenSSH format (what `ssh-keygen -t ecdsa -b 384` writes). The public key is
  registered with `flwr supernode register`, the private key starts the node
  (`--auth-supernode-private-key`); a SuperLink started with `--enable-supernode-auth` admits
  registered nodes only.

For a test on one machine: a real federation gets its certificates from the organisation's own
CA, and each node makes its own key pair and keeps the private key to itself.
"""
from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["write_credentials", "CA_CERT", "SERVER_CERT", "SERVER_KEY", "node_key"]

CA_CERT, SERVER_CERT, SERVER_KEY = "certificates/ca.crt", "certificates/server.pem", "certificates/server.key"
HOSTS = ("127.0.0.1", "localhost")
VALID_DAYS = 30


def node_key(i: int) -> str:
    """SuperNode i's private key file (its public key: the same name plus `.pub`)."""
    return f"keys/supernode-{i}"


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name, signer: ec.EllipticCurvePrivateKey,
                 ca: bool) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(issuer).public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        names = [x509.IPAddress(ipaddress.ip_address(HOSTS[0])), x509.DNSName(HOSTS[1])]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(signer, hashes.SHA256())


def write_credentials(folder: str | os.PathLike, num_nodes: int) -> Path:
    """Write a CA, the SuperLink's certificate and `num_nodes` SuperNode key pairs under
    `folder` (see the module docstring); returns `folder`."""
    folder = Path(folder)
    pem = serialization.Encoding.PEM
    ca_key, server_key = ec.generate_private_key(ec.SECP384R1()), ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedsteer local test CA")])
    ca_cert = _certificate("fedsteer local test CA", ca_key, ca_name, ca_key, ca=True)
    server_cert = _certificate(HOSTS[0], server_key, ca_name, ca_key, ca=False)
    _write(folder / CA_CERT, ca_cert.public_bytes(pem))
    _write(folder / SERVER_CERT, server_cert.public_bytes(pem))
    _write(folder / SERVER_KEY, server_key.private_bytes(pem, serialization.PrivateFormat.TraditionalOpenSSL,
                                                         serialization.NoEncryption()), private=True)
    for i in range(num_nodes):
        key = ec.generate_private_key(ec.SECP384R1())
        _write(folder / node_key(i), key.private_bytes(pem, serialization.PrivateFormat.OpenSSH,
                                                       serialization.NoEncryption()), private=True)
        public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        _write(folder / f"{node_key(i)}.pub", public + f" supernode-{i}\n".encode())
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, required=True, help="how many SuperNode key pairs to write")
    parser.add_argument("--out", default=".", help="the folder to write certificates/ and keys/ into")
    args = parser.parse_args(argv)
    if args.nodes < 1:
        parser.error(f"--nodes must be >= 1, got {args.nodes}")
    folder = write_credentials(args.out, args.nodes)
    print(f"wrote {folder / 'certificates'} and {args.nodes} key pair(s) in {folder / 'keys'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
