"""A real S3 API on loopback for tests and scripts/bench_storage.py: moto's server, and a proxy in front of it.

:func:`start_moto` runs moto's ``ThreadedMotoServer`` on 127.0.0.1 (a free port); :class:`S3Proxy` forwards to
it and adds what a real store does to a client: latency per request, a denied bucket (403 AccessDenied), and a
held upload (the PUT of a chosen key stops after its first bytes until released, so a test can kill the writer
mid-upload at a known instant, not a guessed one). No network beyond loopback; the credentials are dummies.
"""

from __future__ import annotations

import http.client
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DUMMY_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",  # never ask an instance-metadata service for credentials
}


@dataclass
class MotoServer:
    """A running moto server: its endpoint and the environment a client process needs to reach it."""

    server: Any
    endpoint: str

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        return {**DUMMY_CREDENTIALS, "AWS_ENDPOINT_URL": endpoint or self.endpoint}

    def stop(self) -> None:
        self.server.stop()


def start_moto() -> MotoServer:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return MotoServer(server, f"http://{host}:{port}")


@dataclass
class MotoProcess(MotoServer):
    """moto's server in its own process (scripts/bench_storage.py: its CPU time off the measured process's GIL)."""

    def stop(self) -> None:
        self.server.terminate()
        self.server.wait(timeout=30)


def start_moto_process() -> MotoProcess:
    import subprocess
    import sys
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()  # noqa: S310 - loopback
            return True
        except OSError:
            return proc.poll() is not None

    if not wait_for(ready, 120) or proc.poll() is not None:
        raise RuntimeError("moto's server did not start")
    return MotoProcess(proc, endpoint)


def s3_client(endpoint: str) -> Any:
    """A boto3 client of the server (tests create buckets and read objects with it, not with segtrain's code)."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )


@dataclass
class S3Proxy:
    """Loopback HTTP proxy in front of an S3 endpoint, counting requests (and their clients' User-Agent).

    ``delay_s``: added to every request; ``deny``: bucket names answered with 403 AccessDenied; ``fail_next``: the
    next requests answered 503; ``drop_next``: the next requests' connections closed unanswered; ``hold``: a
    regex of request paths whose PUT (after ``hold_after`` of them went through) is held after its first bytes:
    ``held`` is set then, and the request never reaches the store (``release`` ends it, unanswered)."""

    upstream: str
    delay_s: float = 0.0
    deny: set[str] = field(default_factory=set)
    hold: str | None = None
    hold_after: int = 0  # matching PUTs let through before the hold starts
    held: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    fail_next: int = 0  # the next requests answered 503 SlowDown (a transient error, which clients retry)
    drop_next: int = 0  # the next requests read, then their connection closed without an answer (a store going down)
    requests: int = 0
    agents: list[str] = field(default_factory=list)  # each request's User-Agent: which client sent it
    _server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"  # bound there in start()

    def start(self) -> S3Proxy:
        proxy = self
        target = re.sub(r"^https?://", "", self.upstream)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()  # headers and body leave in separate writes: no Nagle wait between them
                self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                proxy.requests += 1
                proxy.agents.append(self.headers.get("User-Agent", ""))
                if proxy.delay_s:
                    time.sleep(proxy.delay_s)
                bucket = self.path.lstrip("/").split("/", 1)[0].split("?", 1)[0]
                length = int(self.headers.get("Content-Length") or 0)
                if proxy.drop_next > 0:
                    proxy.drop_next -= 1
                    self.rfile.read(length)
                    self.close_connection = True
                    self.request.shutdown(socket.SHUT_RDWR)
                    return None
                if proxy.fail_next > 0:
                    proxy.fail_next -= 1
                    self.rfile.read(length)
                    return self._answer(
                        503, b"<?xml version='1.0'?><Error><Code>SlowDown</Code><Message>Slow down</Message></Error>"
                    )
                if bucket in proxy.deny:
                    self.rfile.read(length)
                    return self._answer(
                        403,
                        b"<?xml version='1.0'?><Error><Code>AccessDenied</Code>"
                        b"<Message>Access Denied</Message></Error>",
                    )
                matches = proxy.hold and re.search(proxy.hold, self.path.split("?", 1)[0])
                if self.command == "PUT" and matches and proxy.hold_after > 0:
                    proxy.hold_after -= 1
                elif self.command == "PUT" and matches:
                    self.rfile.read(min(length, 1024))
                    proxy.held.set()
                    proxy.release.wait()
                    self.close_connection = True
                    return None
                body = self.rfile.read(length) if length else None
                conn = http.client.HTTPConnection(target, timeout=60)
                conn.connect()
                assert conn.sock is not None
                conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection",)}
                conn.request(self.command, self.path, body=body, headers=headers)
                answer = conn.getresponse()
                data = answer.read()
                self.send_response(answer.status)
                for k, v in answer.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()
                return None

            def _answer(self, status: int, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        class Server(ThreadingHTTPServer):
            request_queue_size = 256  # every loader worker's reading threads connect at once (the default, 5,
            # drops connections, which the clients only retry after seconds)

        self._server = Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


class SilentStore:
    """A loopback port that accepts connections and never answers (a hung store, or the wrong service behind
    ``AWS_ENDPOINT_URL``): a client only learns it from its own timeouts."""

    def __init__(self) -> None:
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(256)
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._socket.getsockname()[1]}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._socket.accept()
            except OSError:
                return
            self._held.append(conn)  # held open, never read from nor written to

    def stop(self) -> None:
        self._stop.set()
        self._socket.close()
        for conn in self._held:
            conn.close()


def closed_port_endpoint() -> str:
    """An endpoint where nothing listens (the connection is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def client_of(agent: str) -> str:
    """Which client sent a request, from its User-Agent: ``obstore`` (Rust's object_store) or ``s3fs`` (botocore)."""
    return "obstore" if "object_store" in agent or "obstore" in agent else "s3fs"


def child_env(endpoint: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """os.environ for a child process using the store at ``endpoint`` with dummy credentials."""
    return {**os.environ, **DUMMY_CREDENTIALS, "AWS_ENDPOINT_URL": endpoint, **(extra or {})}


def wait_for(condition: Callable[[], bool], timeout_s: float = 120.0) -> bool:
    """Poll ``condition`` until true (a generous bound: the machine may be loaded)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.05)
    return False
