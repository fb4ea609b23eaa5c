"""A TLS front that requires a client certificate, before a local HTTPS service (the tests' registry).

Apicurio 3.0.9 cannot require client certificates itself (Quarkus fixes `quarkus.http.ssl.client-auth` at build
time), which is what a registry behind a mutual-TLS ingress or load balancer does. `TlsFront(ca, server, backend)`
listens on a free loopback port, completes a TLS handshake only with a client certificate signed by `ca`, and relays
the bytes to the backend over a TLS connection of its own (verified against the same CA). It runs in a daemon thread
of the process that starts it; `url` is the backend's URL with the front's port.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

from .certificates import Pem
from .processes import free_port


class TlsFront:
    def __init__(self, ca: Path, server: Pem, backend_url: str):
        self.backend = urlsplit(backend_url)
        self.port = free_port()
        self.url = urlunsplit(self.backend._replace(netloc=f"127.0.0.1:{self.port}"))
        self._accept = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ca))
        self._accept.load_cert_chain(str(server.certificate), str(server.key))
        self._accept.verify_mode = ssl.CERT_REQUIRED
        self._connect = ssl.create_default_context(cafile=str(ca))
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"tls-front-{self.port}", daemon=True)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._relay, "127.0.0.1", self.port, ssl=self._accept)
        )
        self._ready.set()
        self._loop.run_forever()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(
                self.backend.hostname, self.backend.port, ssl=self._connect, server_hostname=self.backend.hostname
            )
        except OSError:
            writer.close()
            return

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (OSError, ssl.SSLError):
                pass
            finally:
                sink.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    def start(self) -> TlsFront:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        if self._ready.is_set():

            async def close() -> None:  # the server, and the relays still open (the registry client's pool)
                self._server.close()
                for task in asyncio.all_tasks():
                    if task is not asyncio.current_task():
                        task.cancel()

            asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> TlsFront:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()
