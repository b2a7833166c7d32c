"""The chaos run's own ports: the first free ones, so two runs at once do not collide."""

from __future__ import annotations

import socket

import pytest

from tests.support.services import free_port
from tools.chaos.__main__ import _first_free, main


def test_ports_in_use_are_skipped() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        assert _first_free(port, lambda base: (base,), step=1) > port
    free = free_port()
    assert _first_free(free, lambda base: (base,), step=1) == free


def test_the_shared_broker_port_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--broker-port", "9092"])
    assert "a port of its own" in capsys.readouterr().err
