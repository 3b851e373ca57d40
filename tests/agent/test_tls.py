"""An agent reaches a server that speaks TLS (SMON_TLS_CA), and its token does not travel in clear;
the HTTP listener speaks TLS too."""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

import smon
from smon_server.runtime import BackgroundServer
from smon_server.store.models import StepRecord
from tests.agent.conftest import FAST
from tests.support.settings import server_settings


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


def test_a_tls_mismatch_is_one_clear_line_in_the_jobs_output(tmp_path: Path) -> None:
    """gRPC's own `Handshake failed` lines (56-59 a rank in 7.5 s, one per attempt) stay out of
    the training job's stderr; the agent says once what is wrong and what to set."""
    cert, key = self_signed(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    stranger, _ = self_signed(other)  # a CA that did not sign the server's certificate
    settings = server_settings(
        f"sqlite:///{tmp_path / 'smon.db'}", tls_cert_file=cert, tls_key_file=key, analysis_interval=3600
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    with BackgroundServer(settings) as server:
        jobs = {
            name: subprocess.Popen(
                [sys.executable, "-m", "tests.agent.tls_job", server.grpc_target, ca, "2.5"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=root,
            )
            for name, ca in (("plain", ""), ("wrong_ca", str(stranger)))
        }
        outputs = {name: job.communicate(timeout=60) for name, job in jobs.items()}
    for name, (out, err) in outputs.items():
        assert int(out.split()[-1]) > 0, (name, err)  # every step was lost, and counted
        lines = err.strip().splitlines()
        assert not [line for line in lines if "Handshake failed" in line or "ssl_transport" in line], err
        said = [line for line in lines if "cannot reach SMon server" in line]
        assert len(said) == 1, err  # one line for the whole episode
        assert len(lines) == 2, err  # ... and the one that counts what was lost at exit
    plain = outputs["plain"][1]
    assert "the server speaks TLS and this agent connects without it: set SMON_TLS=1" in plain
    assert "not signed by a CA this agent trusts (SMON_TLS_CA=" in outputs["wrong_ca"][1]
