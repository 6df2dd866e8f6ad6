"""The server's listening socket (serve/launch.bind_socket): the connections it accepts run without Nagle's
algorithm (TCP_NODELAY, read back from the kernel), as asyncio sets it only on sockets whose proto is TCP."""

import asyncio
import socket

import pytest

from scratchlm.serve.launch import bind_socket


def test_accepted_connections_have_nagle_off():
    async def scenario() -> int:
        seen: list[int] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            sock = writer.get_extra_info("socket")
            seen.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        listener = bind_socket("127.0.0.1", 0)
        server = await asyncio.start_server(handle, sock=listener)
        port = listener.getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.01)
        writer.close()
        server.close()
        await server.wait_closed()
        return seen[0]

    assert asyncio.run(scenario()) != 0


def test_bad_port_and_busy_address_are_named():
    with pytest.raises(ValueError, match="--port 70000"):
        bind_socket("127.0.0.1", 70000)
    held = bind_socket("127.0.0.1", 0)
    try:
        with pytest.raises(ValueError, match="cannot listen on 127.0.0.1"):
            bind_socket("127.0.0.1", held.getsockname()[1])
    finally:
        held.close()
