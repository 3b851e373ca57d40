"""What a failed connection to the server means, in words an ML engineer can act on.

gRPC reports a TLS mismatch in its own terms: a plain-text agent against a TLS server sees
`Socket closed`, a TLS agent against a plain server `WRONG_VERSION_NUMBER`, a certificate signed
by another CA `CERTIFICATE_VERIFY_FAILED`. `hint()` turns these into the setting to change. For
the first, where gRPC's words fit other causes too, it first checks: a TLS handshake with the
server (no certificate check) that succeeds means the server speaks TLS.
"""

from __future__ import annotations

import re
import socket

PROBE_SECONDS = 2.0


def hint(details: str, *, server: str, tls: bool, ca_file: str | None) -> str:
    """A sentence that names the likely cause and its fix, or "" when there is nothing to add."""
    text = details.lower()
    if "storage unavailable" in text:
        return "the server is up but its database is away; this agent keeps its records and resends them"
    if not tls:
        if ("socket closed" in text or "connection reset" in text) and speaks_tls(server):
            return (
                "the server speaks TLS and this agent connects without it: set SMON_TLS=1 "
                "(a certificate from a public CA) or SMON_TLS_CA=<the CA's PEM file>"
            )
        return ""
    trusted = f"SMON_TLS_CA={ca_file}" if ca_file else "the system's root certificates (SMON_TLS=1)"
    if "wrong_version_number" in text or "wrong version number" in text:
        return (
            "the server does not speak TLS on this port: unset SMON_TLS / SMON_TLS_CA, or start "
            "the server with SMON_TLS_CERT_FILE and SMON_TLS_KEY_FILE"
        )
    if "certificate_verify_failed" in text or "certificate verify failed" in text:
        return f"the server's certificate is not signed by a CA this agent trusts ({trusted})"
    if "peer name" in text or "hostname" in text:
        return f"the server's certificate does not name {server!r}: connect by a name it lists"
    return ""


def speaks_tls(server: str, timeout: float = PROBE_SECONDS) -> bool:
    """Whether a TLS handshake with `server` (host:port) completes, trusting any certificate."""
    import ssl  # only when a connection failed: the training process may never need it

    address = host_port(server)
    if address is None:
        return False
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])  # what a gRPC server expects of its clients
    try:
        with (
            socket.create_connection(address, timeout=timeout) as raw,
            context.wrap_socket(raw, server_hostname=address[0]),
        ):
            return True
    except (OSError, ValueError):  # ssl.SSLError is an OSError
        return False


def host_port(server: str) -> tuple[str, int] | None:
    """(host, port) of a gRPC target written `host:port` or `[v6]:port` (dns:/// allowed)."""
    target = server.removeprefix("dns:///").removeprefix("dns:")
    match = re.fullmatch(r"\[([^\]]+)\]:(\d+)|([^:/\[\]]+):(\d+)", target)
    if match is None:
        return None
    host = match.group(1) or match.group(3)
    return host, int(match.group(2) or match.group(4))
