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
own process, and moves the bytes with splice(2) (socket to pipe to socket,
in the kernel): a reader that moves many bytes, as one downloading whole
shards does, costs it little CPU (a first version copied them through
Python and charged such a reader for it).
"""
import argparse
import fcntl
import os
import socket
import threading
import time

CHUNK = 1 << 20


def _pump(src: socket.socket, dst: socket.socket, before, after) -> None:
    """Moves bytes from `src` to `dst` until `src` ends; `before()` runs when
    bytes arrived and before they go on, `after()` once they went."""
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, 1031, CHUNK)  # F_SETPIPE_SZ: a few large splices, not many small
    except OSError:
        pass
    try:
        while True:
            n = os.splice(src.fileno(), w, CHUNK)
            if n == 0:
                break
            before()
            while n:
                n -= os.splice(r, dst.fileno(), n)
            after()
    except OSError:
        pass
    finally:
        os.close(r)
        os.close(w)
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _connection(client: socket.socket, upstream: tuple, delay: float) -> None:
    try:
        server = socket.create_connection(upstream)
        server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        client.close()
        return
    answered = [True]  # the next client bytes start a request

    def request_arrived() -> None:
        if answered[0]:
            answered[0] = False
            time.sleep(delay)

    def answer_sent() -> None:
        answered[0] = True

    up = threading.Thread(target=_pump, args=(client, server, request_arrived, lambda: None),
                          daemon=True)
    up.start()
    _pump(server, client, lambda: None, answer_sent)
    up.join()
    client.close()
    server.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--upstream", required=True, help="host:port of the server")
    ap.add_argument("--delay-ms", type=float, required=True)
    args = ap.parse_args()
    host, port = args.upstream.rsplit(":", 1)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(512)
    print(listener.getsockname()[1], flush=True)
    while True:
        client, _ = listener.accept()
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_connection, args=(client, (host, int(port)), args.delay_ms / 1000),
                         daemon=True).start()


if __name__ == "__main__":
    main()
