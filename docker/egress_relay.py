"""mcp-sandbox egress relay.

A sandbox whose egress policy is not `open` has no network interface but
loopback. This relay, started by the agent, listens on MCP_EGRESS_LISTEN
(127.0.0.1:3128, where HTTP_PROXY and HTTPS_PROXY point) and copies each
connection to the server's egress proxy through the unix socket at
MCP_EGRESS_SOCKET. It enforces nothing: the proxy on the host decides what
each connection may reach. Stdlib only.
"""

import asyncio
import os

CHUNK = 64 * 1024


async def pipe(reader, writer):
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            pass


async def relay(socket_path, client_r, client_w):
    try:
        proxy_r, proxy_w = await asyncio.open_unix_connection(socket_path)
    except OSError:
        client_w.write(
            b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 37\r\nConnection: close\r\n\r\n"
            b"mcp-sandbox egress proxy unavailable\n"
        )
        client_w.close()
        return
    await asyncio.gather(pipe(client_r, proxy_w), pipe(proxy_r, client_w))
    for w in (client_w, proxy_w):
        w.close()


async def main():
    socket_path = os.environ["MCP_EGRESS_SOCKET"]
    host, port = os.environ.get("MCP_EGRESS_LISTEN", "127.0.0.1:3128").rsplit(":", 1)
    server = await asyncio.start_server(
        lambda r, w: relay(socket_path, r, w), host, int(port), reuse_address=True
    )
    # Listening: tell the agent, which waits for this before it serves.
    os.write(1, b"ready\n")
    os.close(1)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
