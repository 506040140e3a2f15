"""Clients of a server that requires a token (`--native-token`) or speaks
TLS (`--tls-cert`): `Client(..., token=...)` and `Client(..., tls_ca=...)`
(and `ShardedClient` alike) connect; without them, or with a wrong token,
the connection is refused with a clear error."""

import shutil
import subprocess

import pytest

import granary

from conftest import Server


@pytest.fixture(scope="module")
def token_server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("token") / "g.db", extra=("--native-token", "s3cret"))
    yield s
    s.stop()


def test_a_token_is_sent_and_required(token_server):
    with pytest.raises(granary.Error, match="requires a token"):
        granary.Client(token_server.address)
    with pytest.raises(granary.Error, match="refused the token"):
        granary.Client(token_server.address, token="wrong")
    c = granary.Client(token_server.address, token="s3cret")
    c.put(b"k", b"v")
    assert granary.Client(token_server.address, token=b"s3cret").get(b"k") == b"v"
    s = granary.ShardedClient([token_server.address], token="s3cret")
    assert s.get(b"k") == b"v"
    with pytest.raises(granary.Error, match="1 to 1024 bytes"):
        granary.Client(token_server.address, token=b"")


def openssl(cwd, *args):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certs(d):
    """A CA and a server certificate for 127.0.0.1 it signed."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl(d, "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=granary-test-ca",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    (d / "server.ext").write_text("basicConstraints=CA:FALSE\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n"
                                  "extendedKeyUsage=serverAuth\n")
    openssl(d, "req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    openssl(d, "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.pem", "-days", "2", "-extfile", "server.ext")


def test_tls_is_spoken_with_the_ca_given(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is missing (scripts/test.sh installs it)")
    make_certs(tmp_path)
    s = Server(tmp_path / "g.db", extra=("--tls-cert", str(tmp_path / "server.pem"),
                                        "--tls-key", str(tmp_path / "server.key")))
    try:
        c = granary.Client(s.address, tls_ca=str(tmp_path / "ca.pem"))
        c.put(b"t", b"over tls")
        named = granary.Client(s.address, tls_ca=str(tmp_path / "ca.pem"), tls_name="localhost")
        assert named.get(b"t") == b"over tls"
        assert granary.ShardedClient([s.address], tls_ca=str(tmp_path / "ca.pem")).get(b"t") == b"over tls"
        with pytest.raises(granary.Error):
            granary.Client(s.address, timeout=5.0).get(b"t")
        with pytest.raises(ValueError, match="need tls_ca"):
            granary.Client(s.address, tls_name="localhost")
    finally:
        s.stop()
