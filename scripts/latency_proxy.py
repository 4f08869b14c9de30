"""A TCP proxy on loopback that delays every request by a fixed time, as an
object store's first-byte latency does: S3 answers a GET in about 10-30 ms
in its own region, a server on loopback in well under one. The remote
bench's ``--latency-ms`` puts it in front of SeaweedFS, so that every
reader (loaderx, obstore, the peers) pays that latency per request and the
readers' request counts and concurrency show as they would on S3.

    python scripts/latency_proxy.py --upstream 127.0.0.1:8333 --delay-ms 10

Prints the port it listens on (one line), then serves until killed. A
request is the first bytes a client sends after the server's answer to its
previous one (HTTP/1.1 on a kept-alive connection): those wait `delay`
before they go on; everything else is forwarded as it comes. It runs in its
own process, so its CPU is not the client's.
"""
import argparse
import asyncio
import socket

CHUNK = 1 << 18


async def _serve(upstream: tuple, delay: float, sock: socket.socket) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*upstream)
        except OSError:
            writer.close()
            return
        answered = [True]  # the next client bytes start a request

        async def to_server() -> None:
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    break
                if answered[0]:
                    answered[0] = False
                    await asyncio.sleep(delay)
                up_writer.write(data)
                await up_writer.drain()
            up_writer.close()

        async def to_client() -> None:
            while True:
                data = await up_reader.read(CHUNK)
                if not data:
                    break
                answered[0] = True
                writer.write(data)
                await writer.drain()
            writer.close()

        try:
            await asyncio.gather(to_server(), to_client())
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
            up_writer.close()

    server = await asyncio.start_server(handle, sock=sock, limit=CHUNK)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--upstream", required=True, help="host:port of the server")
    ap.add_argument("--delay-ms", type=float, required=True)
    args = ap.parse_args()
    host, port = args.upstream.rsplit(":", 1)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(512)
    print(sock.getsockname()[1], flush=True)
    asyncio.run(_serve((host, int(port)), args.delay_ms / 1000, sock))


if __name__ == "__main__":
    main()
