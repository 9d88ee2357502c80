"""The exec stream keeps the frames that arrive with the upgrade's headers (no daemon needed)."""

import http.client
import socket
import time
from types import SimpleNamespace

import pytest

from environments.sandbox.docker import DockerStreamTransport
from environments.sandbox.shell_session import OutputCap, read_to_eof

pytestmark = pytest.mark.unit

UPGRADE = (b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\n"
           b"Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n")


def _frame(data: bytes, stream: int = 1) -> bytes:
    return bytes([stream, 0, 0, 0]) + len(data).to_bytes(4, "big") + data


def _hijacked(first_write: bytes, later: bytes = b"") -> tuple[DockerStreamTransport, socket.socket]:
    """What docker-py's exec_start(socket=True) returns: the SocketIO under http.client's
    buffered reader, with the response attached as `_response`."""
    ours, daemon = socket.socketpair()
    daemon.sendall(first_write)  # one write: headers and frames reach the reader together
    response = http.client.HTTPResponse(ours)
    response.begin()
    sock_io = response.fp.raw
    sock_io._response = SimpleNamespace(raw=SimpleNamespace(_fp=response))
    if later:
        daemon.sendall(later)
    return DockerStreamTransport(sock_io), daemon


def _drain(transport: DockerStreamTransport) -> bytes:
    cap = OutputCap(1 << 16)
    assert read_to_eof(transport, cap, time.monotonic() + 5)
    return cap.value()


def test_frames_read_together_with_the_headers_are_kept():
    transport, daemon = _hijacked(UPGRADE + _frame(b"hello\n"))
    daemon.close()
    assert _drain(transport) == b"hello\n"


def test_frames_split_between_the_buffer_and_the_socket_stay_in_order():
    first = UPGRADE + _frame(b"diff --git a/x b/x\n") + _frame(b"+new")[:5]
    transport, daemon = _hijacked(first, later=_frame(b"+new")[5:] + _frame(b" line\n", stream=2))
    daemon.close()
    assert _drain(transport) == b"diff --git a/x b/x\n+new line\n"


def test_nothing_buffered_means_nothing_invented_and_the_socket_still_blocks():
    transport, daemon = _hijacked(UPGRADE)
    assert transport.recv(0.05) == b""  # no data yet: a timeout, not an end
    daemon.sendall(_frame(b"late\n"))
    daemon.close()
    assert _drain(transport) == b"late\n"
