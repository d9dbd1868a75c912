"""``lockd.common.serving.coalesce``: the writes of one loop step leave as one; close sends them
first; abort drops them; everything else is the real transport's."""

from __future__ import annotations

import asyncio

from lockd.common.serving.coalesce import _CoalescingTransport, coalescing_protocol


class _Recorder:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.events: list[str] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.events.append("close")
        self.closing = True

    def abort(self) -> None:
        self.events.append("abort")
        self.closing = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


async def _step() -> None:
    """Two turns of the event loop: what the transport's coalescing is measured in."""
    for _ in range(2):
        await asyncio.sleep(0)  # one loop turn (the unit under test, not a wait)


def test_writes_of_one_step_leave_as_one_send():
    async def run() -> None:
        real = _Recorder()
        t = _CoalescingTransport(real)  # type: ignore[arg-type]
        t.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        t.write(b"{}")
        assert real.writes == [] and t.get_write_buffer_size() == 40
        await _step()
        assert real.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
        t.write(b"next")
        await _step()
        assert real.writes[1:] == [b"next"]
        assert t.get_extra_info("peername") == "info:peername"  # passed through

    asyncio.run(run())


def test_close_sends_what_was_written_first_and_abort_drops_it():
    async def run() -> None:
        real = _Recorder()
        t = _CoalescingTransport(real)  # type: ignore[arg-type]
        t.write(b"a")
        t.write(b"b")
        t.close()
        assert real.writes == [b"ab"] and real.events == ["close"]
        await _step()
        assert real.writes == [b"ab"], "nothing is sent twice"

        real = _Recorder()
        t = _CoalescingTransport(real)  # type: ignore[arg-type]
        t.write(b"lost")
        t.abort()
        await _step()
        assert real.writes == [] and real.events == ["abort"]

    asyncio.run(run())


def test_the_protocol_gets_the_coalescing_transport():
    seen = []

    class Base:
        def connection_made(self, transport) -> None:
            seen.append(transport)

    async def run() -> None:
        coalescing_protocol(Base)().connection_made(_Recorder())

    asyncio.run(run())
    assert isinstance(seen[0], _CoalescingTransport)
