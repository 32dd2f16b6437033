"""Does a TLS server refuse TLS 1.0 and 1.1? The one rule for the Molecule verifies and the site test.

python3 -m tests.old_tls ADDRESS [PORT] prints each version's outcome; exit status 1 unless both are refused.

The client really offers the old version (SECLEVEL=0 re-enables its ciphers in OpenSSL 3; without it, the
client fails on its own with "no ciphers available" / "no protocols available", which proves nothing), so
the only outcome that counts as a refusal is the server's protocol_version alert: "tlsv1 alert protocol
version", received from the server.
"""

from __future__ import annotations

import socket
import ssl
import sys
import warnings

REFUSED = "TLSV1_ALERT_PROTOCOL_VERSION"  # an alert the server sent; never raised for the client's own limits

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # the old versions are what is being probed
    OLD_VERSIONS = (ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1)


def handshake(address: str, port: int, version: ssl.TLSVersion) -> str:
    """Handshake with exactly `version`, certificate unchecked; 'ok <version>' or the SSL error's reason."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx.minimum_version = ctx.maximum_version = version
    try:
        with socket.create_connection((address, port), timeout=10) as s, ctx.wrap_socket(s) as t:
            return f"ok {t.version()}"
    except ssl.SSLError as err:
        return f"{err.reason}: {err}"


def old_versions(address: str, port: int = 443) -> dict[str, str]:
    return {v.name: handshake(address, port, v) for v in OLD_VERSIONS}


def refused(outcome: str) -> bool:
    return outcome.startswith(REFUSED + ":")


def main(argv: list[str]) -> int:
    address, port = argv[0], int(argv[1]) if len(argv) > 1 else 443
    outcomes = old_versions(address, port)
    for name, outcome in outcomes.items():
        print(f"{name}: {'refused by the server' if refused(outcome) else 'NOT REFUSED'} ({outcome})")
    return 0 if all(map(refused, outcomes.values())) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
