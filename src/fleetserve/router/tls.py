"""TLS for the gateway: a given certificate, or a self-signed one made on first start (HyperPod's default),
written where users can fetch it for their clients (`verify=PATH` / `SSL_CERT_FILE`)."""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

RENEW_BEFORE = datetime.timedelta(days=30)  # a self-signed certificate this close to its end is made again


class TLSFileError(ValueError):
    """A certificate or key the gateway cannot serve with; the message says which file and why."""


def not_after(cert_path: str | Path) -> datetime.datetime:
    """The end of a PEM certificate's validity (the first certificate of the file)."""
    from cryptography import x509

    return x509.load_pem_x509_certificate(Path(cert_path).read_bytes()).not_valid_after_utc


def check_tls_files(cert_path: str, key_path: str) -> str | None:
    """TLSFileError when the pair cannot serve (a missing file, a folder, not PEM, a key of another certificate,
    a key behind a passphrase, which OpenSSL would ask for on the terminal); a warning when the certificate has
    expired or will within 30 days (clients refuse it then), else None."""
    import ssl

    for flag, path in (("--tls-cert", cert_path), ("--tls-key", key_path)):
        p = Path(path)
        if not p.is_file():
            raise TLSFileError(f"{flag} {path}: {'a folder, not a file' if p.is_dir() else 'no such file'}")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)

    def passphrase() -> str:
        raise TLSFileError(f"--tls-key {key_path}: the key is encrypted with a passphrase; give an unencrypted PEM "
                           "key (openssl pkey -in KEY -out PLAIN)")

    try:
        context.load_cert_chain(cert_path, key_path, password=passphrase)
    except TLSFileError:
        raise
    except ssl.SSLError as exc:
        why = "the key is not the certificate's" if "KEY_VALUES_MISMATCH" in str(exc) else \
            f"not a PEM certificate and its key ({exc.reason or exc})"
        raise TLSFileError(f"--tls-cert {cert_path} / --tls-key {key_path}: {why}") from None
    except OSError as exc:
        raise TLSFileError(f"--tls-cert {cert_path} / --tls-key {key_path}: {exc.strerror or exc}") from None
    try:
        end = not_after(cert_path)
    except ValueError:
        return None
    now = datetime.datetime.now(datetime.UTC)
    if end <= now:
        return f"--tls-cert {cert_path} expired on {end:%Y-%m-%d}: clients refuse it"
    if end - now < RENEW_BEFORE:
        return f"--tls-cert {cert_path} expires on {end:%Y-%m-%d}"
    return None


WILDCARDS = ("0.0.0.0", "::", "")  # a router listening on every address


def certificate_hosts(host: str) -> tuple[str, ...]:
    """The names a self-signed certificate must carry for clients of a router on `host`: loopback always, and for
    a wildcard host this machine's name and addresses (it had named 0.0.0.0, which no client connects to, so no
    remote client could verify it)."""
    import socket

    names = ["127.0.0.1", "localhost"]
    if host not in WILDCARDS:
        return tuple(dict.fromkeys([host, *names]))
    # the wildcard itself too: the fleet's supervisor (and its printed URL) reach the router at it
    names = [host or "0.0.0.0", *names, *(["::1"] if host == "::" else [])]
    for name in filter(None, (socket.gethostname(), socket.getfqdn())):
        names.append(name)
        try:
            infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
        except OSError:
            continue
        names += [a[4][0].split("%")[0] for a in infos]  # an IPv6 address without its scope
    return tuple(dict.fromkeys([*names, *filter(None, [_primary_address()])]))


def _primary_address() -> str | None:
    """The address this machine reaches other hosts from (a UDP socket's route; nothing is sent)."""
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: routed like any remote host, never reached
            return s.getsockname()[0]
    except OSError:
        return None


def ensure_self_signed(folder: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> tuple[Path, Path]:
    """cert.pem and key.pem in `folder`, created once (EC P-256, one year, SANs for `hosts`), and again when the
    one there ends within 30 days (after a year every client had refused it) or does not name every host."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    if cert_path.is_file() and key_path.is_file() and _still_good(cert_path, hosts):
        return cert_path, key_path
    if folder.exists() and not folder.is_dir():
        raise TLSFileError(f"{folder} is a file: the self-signed certificate needs a folder")
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fleetserve gateway")])
    sans = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def _still_good(cert_path: Path, hosts: tuple[str, ...]) -> bool:
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return False
    held = {_canonical(str(n)) for n in names.get_values_for_type(x509.IPAddress)} | \
        {_canonical(n) for n in names.get_values_for_type(x509.DNSName)}
    fresh = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC) > RENEW_BEFORE
    return fresh and all(_canonical(h) in held for h in hosts)


def _canonical(host: str) -> str:
    """An address in its one written form (`0:0::1` is `::1`), a name in lower case: a certificate that names
    the host otherwise spelled was made again at every start, and clients that pinned it broke."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host.lower()
