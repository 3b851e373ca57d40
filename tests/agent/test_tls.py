"""An agent reaches a server that speaks TLS (SMON_TLS_CA), and its token does not travel in clear;
the HTTP listener speaks TLS too."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

import smon
from smon_server.runtime import BackgroundServer
from smon_server.store.models import StepRecord
from tests.agent.conftest import FAST
from tests.conftest import server_settings


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 / localhost and its key, made with the openssl command."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command is not installed (Debian package openssl)")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
            "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


def stored_steps(server: BackgroundServer, job: str) -> int:
    assert server.context is not None
    with server.context.db.session() as session:
        from smon_server.store.models import Job

        key = session.scalar(select(Job.key).where(Job.job_id == job))
        return int(session.scalar(select(func.count()).where(StepRecord.job_key == key)) or 0)


def test_agent_speaks_tls_to_a_tls_server_and_plaintext_does_not_get_through(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    settings = server_settings(
        f"sqlite:///{tmp_path / 'smon.db'}",
        tls_cert_file=cert,
        tls_key_file=key,
        ingest_token="s3cret",
        analysis_interval=3600,
    )
    with BackgroundServer(settings) as server:
        target = server.grpc_target
        secure = smon.attach(
            **{**FAST, "job": "tls-job"}, server=target, token="s3cret", tls_ca_file=str(cert)
        )
        plain = smon.attach(**{**FAST, "job": "plain-job"}, server=target, token="s3cret")
        for _ in range(5):
            secure.step()
            plain.step()
        deadline = time.monotonic() + 20
        while stored_steps(server, "tls-job") < 5 and time.monotonic() < deadline:
            time.sleep(0.1)
        secure.close(timeout=5)
        plain.close(timeout=1)
        assert stored_steps(server, "tls-job") == 5
        assert stored_steps(server, "plain-job") == 0  # a plaintext client cannot talk to it
        # The HTTP listener speaks TLS with the same certificate.
        assert server.ports is not None
        https = f"https://127.0.0.1:{server.ports.http}"
        trusted = ssl.create_default_context(cafile=str(cert))
        assert httpx.get(f"{https}/healthz", verify=trusted, timeout=10).status_code == 200
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{server.http_url}/healthz", timeout=10)  # plain HTTP gets no answer
