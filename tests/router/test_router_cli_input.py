"""`fleetserve router` refuses what it cannot serve with before it starts: exit 2 naming the flag, no traceback
(each of these had been a Python traceback, exit 1, or with --workers a restart loop that never ended)."""

from __future__ import annotations

import datetime
import json
import socket
import subprocess
import sys

import pytest

from fleetserve.router.tls import check_tls_files, ensure_self_signed
from tests.helpers import fleetserve


def _pair(folder, days=365, passphrase: bytes | None = None, name="p"):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "t")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(1).not_valid_before(now - datetime.timedelta(days=400))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .sign(key, hashes.SHA256()))
    crypt = serialization.BestAvailableEncryption(passphrase) if passphrase else serialization.NoEncryption()
    cert_path, key_path = folder / f"{name}.crt", folder / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, crypt))
    return str(cert_path), str(key_path)


def refused(*args, flag: str, says: str):
    r = fleetserve("router", *args, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    text = " ".join(r.stderr.replace("│", " ").split())
    assert flag in text and says in text and "Traceback" not in r.stderr, text
    return text


@pytest.mark.parametrize("url,says", [("http://", "expected http://host:port"),
                                      ("http://127.0.0.1:abc", "Port could not be cast"),
                                      ("http://127.0.0.1:99999", "out of range"), ("http://[::1", "Invalid IPv6")])
def test_a_backend_url_that_is_no_url(url, says):
    refused("--backend", url, flag="--backend", says=says)


def test_a_health_path_without_its_slash():
    refused("--backend", "http://127.0.0.1:9", "--health-path", "health", flag="--health-path", says="starting with /")


def test_tls_files_it_cannot_serve_with(tmp_path):
    cert, key = _pair(tmp_path)
    other_cert, other_key = _pair(tmp_path, name="other")
    _, locked = _pair(tmp_path, passphrase=b"secret", name="locked")
    backend = ("--backend", "http://127.0.0.1:9")
    refused(*backend, "--tls-cert", str(tmp_path / "nope.pem"), "--tls-key", key, flag="--tls-cert",
            says="no such file")
    refused(*backend, "--tls-cert", str(tmp_path), "--tls-key", key, flag="--tls-cert", says="a folder")
    refused(*backend, "--tls-cert", cert, "--tls-key", other_key, flag="--tls-cert", says="not the certificate's")
    refused(*backend, "--tls-cert", cert, "--tls-key", cert, flag="--tls-cert", says="not a PEM certificate")
    # OpenSSL asked for the passphrase on the terminal (a hang), or failed with EINVAL without one
    r = subprocess.run([sys.executable, "-m", "fleetserve", "router", *backend, "--tls-cert",
                        other_cert.replace("other", "locked"), "--tls-key", locked], capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and "encrypted with a passphrase" in " ".join(r.stderr.replace("│", " ").split())
    refused(*backend, "--tls-self-signed", cert, flag="--tls-self-signed", says="is a file")


def test_an_expired_certificate_is_warned_and_a_self_signed_one_made_again(tmp_path):
    cert, key = _pair(tmp_path, days=-1)
    assert "expired on" in check_tls_files(cert, key)
    assert check_tls_files(*_pair(tmp_path, days=365, name="fresh")) is None
    folder = tmp_path / "self"
    folder.mkdir()
    old_cert, old_key = _pair(folder, days=-1, name="cert")
    (folder / "cert.key").rename(folder / "key.pem")
    (folder / "cert.crt").rename(folder / "cert.pem")
    made, _ = ensure_self_signed(folder)
    assert check_tls_files(str(made), str(folder / "key.pem")) is None  # a new one, valid a year
    again, _ = ensure_self_signed(folder)
    assert again.read_bytes() == made.read_bytes()  # and kept while it is good


def test_a_router_on_every_address_certifies_the_names_its_clients_use(tmp_path, monkeypatch):
    """With host 0.0.0.0 the self-signed certificate named 0.0.0.0 and loopback only: no remote client could
    verify it. 0.0.0.0 stays: the fleet's supervisor reaches its router there."""
    from cryptography import x509

    from fleetserve.router import tls

    monkeypatch.setattr(tls, "_primary_address", lambda: "192.0.2.7")
    hosts = tls.certificate_hosts("0.0.0.0")
    assert {"0.0.0.0", "127.0.0.1", "localhost", "192.0.2.7"} <= set(hosts)  # the supervisor calls 0.0.0.0
    assert tls.certificate_hosts("10.1.2.3") == ("10.1.2.3", "127.0.0.1", "localhost")
    cert, _ = ensure_self_signed(tmp_path, hosts)
    names = x509.load_pem_x509_certificate(cert.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert "192.0.2.7" in {str(a) for a in names.get_values_for_type(x509.IPAddress)}


@pytest.mark.parametrize("document,says", [({"keys": []}, "with at least one key"), ({"keys": {}}, "at least one key"),
                                           (["x"], "at least one key"),
                                           ({"keys": {"sk-alpha-123": "alpha"}}, "sha256 hex digest")])
def test_an_auth_file_that_names_no_usable_key(tmp_path, document, says):
    path = tmp_path / "auth.json"
    path.write_text(json.dumps(document))
    token = tmp_path / "token"
    token.write_text("t" * 32)
    refused("--backend", "http://127.0.0.1:9", "--auth-file", str(path), "--internal-token-file", str(token),
            flag="--auth-file", says=says)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_port_another_server_holds(workers):
    """With --workers the second router had shared the port with the first (SO_REUSEPORT), splitting traffic."""
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = str(other.getsockname()[1])
        refused("--backend", "http://127.0.0.1:9", "--port", port, "--workers", workers, flag="--port",
                says="already in use")


def test_a_self_signed_folder_beside_a_certificate_is_refused(tmp_path):
    """--tls-self-signed with --tls-cert/--tls-key started on the given pair, the folder ignored without a word."""
    refused("--backend", "http://127.0.0.1:9", "--tls-self-signed", str(tmp_path / "self"), "--tls-cert",
            str(tmp_path / "c.pem"), "--tls-key", str(tmp_path / "k.pem"), flag="--tls-self-signed",
            says="not both")
    assert not (tmp_path / "self").exists()
