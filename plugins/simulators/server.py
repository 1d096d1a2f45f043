"""HTTP(S) server base for the vendor simulators.

A vendor simulator is a `SimulatorApp`: it turns a `Request` into a `Response` (usually through a
`Router`) and knows its own error envelope. `SimulatorServer` runs an app on 127.0.0.1 (port 0 by
default: the kernel picks a free one), one thread per connection, HTTP/1.1 keep-alive, optional
TLS, and applies the base faults (`faults.py`) before the app sees a request.

Admin endpoints (no auth; loopback only), under `/_sim/`:
  GET/POST/DELETE /_sim/faults   list / arm (one fault object or a list) / disarm all
  GET /_sim/clock, POST /_sim/clock {"advance": seconds}   (ManualClock or AdvancingClock)
  GET /_sim/state                the app's `state()` (for people poking at a simulator)
"""

from __future__ import annotations

import collections
import contextlib
import json
import re
import socket
import ssl
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar, Protocol
from urllib.parse import parse_qs, urlsplit

from ringsnap.logs import get_logger
from ringsnap.plugins.simulators.faults import BASE_KINDS, Fault, FaultPlan

_log = get_logger(__name__)

ADMIN_PREFIX = "/_sim/"


class Clock(Protocol):
    """Wall-clock time in epoch seconds; injectable so tests can jump ahead."""

    def now(self) -> float: ...


class SystemClock:
    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock that only moves when told to (job expiry, session expiry in tests)."""

    def __init__(self, start: float | None = None) -> None:
        self._now = time.time() if start is None else start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


class AdvancingClock:
    """The system clock plus an offset tests can push forward (expiry while time still runs)."""

    def __init__(self) -> None:
        self._offset = 0.0
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return time.time() + self._offset

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._offset += seconds


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: Mapping[str, str]
    body: bytes = b""
    #: Values captured from the route pattern (`{uuid}` → params["uuid"]).
    params: dict[str, str] = field(default_factory=dict)

    def arg(self, name: str, default: str | None = None) -> str | None:
        """The first value of query parameter `name`."""
        values = self.query.get(name)
        return values[0] if values else default

    def header(self, name: str, default: str | None = None) -> str | None:
        lowered = name.lower()
        for key, value in self.headers.items():
            if key.lower() == lowered:
                return value
        return default

    def json(self) -> Any:
        if not self.body.strip():
            return {}
        try:
            return json.loads(self.body)
        except ValueError:
            raise HttpError(400, "request body is not valid JSON") from None


@dataclass
class Response:
    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    #: Raw bytes instead of a JSON body.
    raw: bytes | None = None

    def encode(self) -> bytes:
        if self.raw is not None:
            return self.raw
        if self.body is None:
            return b""
        return json.dumps(self.body).encode()


class HttpError(Exception):
    """Raise from a handler to answer with the vendor's error envelope."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str = "",
        target: str = "",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.target = target
        self.headers = dict(headers or {})


Handler = Callable[[Request], Response]


class Router:
    """Method + path pattern dispatch; `{name}` matches one path segment."""

    def __init__(self) -> None:
        self._routes: list[tuple[str, re.Pattern[str], Handler]] = []

    def add(self, method: str, pattern: str, handler: Handler) -> None:
        regex = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", pattern.rstrip("/") or "/")
        self._routes.append((method.upper(), re.compile(f"^{regex}/?$"), handler))

    def dispatch(self, request: Request) -> Response:
        allowed: list[str] = []
        for method, regex, handler in self._routes:
            match = regex.match(request.path)
            if match is None:
                continue
            if method != request.method:
                allowed.append(method)
                continue
            request.params = match.groupdict()
            return handler(request)
        if allowed:
            raise HttpError(405, f"method {request.method} not allowed on {request.path}")
        raise HttpError(404, f"no API at {request.path}")


class SimulatorApp(ABC):
    """One vendor's API over a LUN pool. Subclasses must be thread-safe."""

    #: Vendor name (`python -m ringsnap.plugins.simulators <vendor>`).
    vendor: ClassVar[str]

    def __init__(self, *, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or SystemClock()
        #: Replaced by the server's plan when the app is served.
        self.faults = FaultPlan()

    def add_host(self, name: str, iqn: str) -> None:
        """Create the array's host object `name` holding the iSCSI initiator `iqn`, as an
        administrator would (the sandbox's hosts: its nodes and drill host)."""
        raise NotImplementedError(f"the {self.vendor} simulator has no host objects")

    @abstractmethod
    def handle(self, request: Request) -> Response:
        """Answer one API request; raise HttpError for errors."""

    @abstractmethod
    def error_response(self, error: HttpError) -> Response:
        """The vendor's error envelope for `error`."""

    def state(self) -> Any:
        """A JSON-able view of the simulator's state, for `/_sim/state`."""
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Stop background work (job threads)."""


@dataclass(frozen=True)
class SimulatorOptions:
    """What `python -m ringsnap.plugins.simulators` hands a vendor module's `create_app()`."""

    pool: Path
    username: str = "admin"
    password: str = "password"  # noqa: S105 - a simulator's default login
    #: Vendor-specific settings from `--set key=value`.
    settings: Mapping[str, str] = field(default_factory=dict)
    clock: Clock | None = None
    #: Mapped clones are loop devices behind their by-id link (`LunPool.fabric_loops`).
    fabric_loops: bool = False


@dataclass(frozen=True)
class ServerTls:
    """Certificate chain and key the simulator serves (PEM)."""

    cert_file: Path
    key_file: Path


class _DropConnection(Exception):
    """Close the connection without answering."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], owner: SimulatorServer) -> None:
        self.owner = owner
        super().__init__(address, _RequestHandler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = self.socket.accept()
        # Headers and body go out in separate writes; without NODELAY, Nagle's algorithm and the
        # client's delayed ACK add ~40 ms to every keep-alive request.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        context = self.owner.ssl_context
        if context is not None:
            # The handshake happens on first read, in the connection's own thread, so a client
            # that stalls or rejects our certificate cannot block the accept loop.
            sock = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that reject our certificate or hang up mid-request are expected in tests.
        _log.debug("simulator connection error", client=str(client_address))


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        _log.debug("simulator request", line=format % args)

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_PATCH(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def _serve(self) -> None:
        owner = self.server.owner
        split = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        request = Request(
            method=self.command.upper(),
            path=split.path,
            query=parse_qs(split.query, keep_blank_values=True),
            headers={key: value for key, value in self.headers.items()},
            body=body,
        )
        try:
            response = owner.respond(request)
        except _DropConnection:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        payload = response.encode()
        self.send_response(response.status)
        headers = {"Content-Type": "application/json", **response.headers}
        if not payload and response.raw is None and response.body is None:
            headers.pop("Content-Type", None)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if payload and self.command != "HEAD":
            self.wfile.write(payload)


class SimulatorServer:
    """Serve one `SimulatorApp` on 127.0.0.1 in background threads."""

    def __init__(
        self,
        app: SimulatorApp,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        tls: ServerTls | None = None,
    ) -> None:
        if not host.startswith("127."):
            raise ValueError("simulators listen on loopback addresses (127.0.0.0/8) only")
        self.app = app
        self.faults = FaultPlan()
        app.faults = self.faults
        #: The API requests received, oldest first, as (method, path), faulted ones included:
        #: tests count what one driver step sends. Bounded, for simulators left running by hand.
        self.requests: collections.deque[tuple[str, str]] = collections.deque(maxlen=100_000)
        self.tls = tls
        self.ssl_context: ssl.SSLContext | None = None
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
            self.ssl_context = context
        self._stopping = threading.Event()
        self._httpd = _Server((host, port), self)
        self._thread: threading.Thread | None = None

    @property
    def host(self) -> str:
        return str(self._httpd.server_address[0])

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    @property
    def clock(self) -> Clock:
        return self.app.clock

    def start(self) -> SimulatorServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"{self.app.vendor}-simulator",
            daemon=True,
        )
        self._thread.start()
        _log.info("simulator listening", vendor=self.app.vendor, url=self.url)
        return self

    def stop(self) -> None:
        """Stop serving; hung requests are woken and dropped instead of processed."""
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self.app.close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def serve_forever(self) -> None:
        """Serve in the calling thread until interrupted (the command line entry)."""
        try:
            self._httpd.serve_forever(poll_interval=0.2)
        finally:
            self._stopping.set()
            self._httpd.server_close()
            self.app.close()

    def __enter__(self) -> SimulatorServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # Request handling

    def respond(self, request: Request) -> Response:
        if request.path.startswith(ADMIN_PREFIX):
            return self._admin(request)
        self.requests.append((request.method, request.path))
        fault = self.faults.take(request.method, request.path, kinds=BASE_KINDS)
        if fault is not None:
            _log.info(
                "simulator fault",
                vendor=self.app.vendor,
                kind=fault.kind,
                method=request.method,
                path=request.path,
            )
            if fault.kind == "reset":
                raise _DropConnection
            if fault.kind == "status":
                error = HttpError(
                    fault.status,
                    fault.message or "injected failure",
                    code=fault.code,
                    headers=fault.headers,
                )
                return self._error(error)
            if fault.kind == "hang":
                woken = self._stopping.wait(fault.seconds)
                if woken or fault.then == "drop":
                    raise _DropConnection
        try:
            return self.app.handle(request)
        except HttpError as error:
            return self._error(error)
        except Exception as error:
            _log.exception("simulator bug", vendor=self.app.vendor, path=request.path)
            return self._error(HttpError(500, f"simulator internal error: {error}"))

    def _error(self, error: HttpError) -> Response:
        response = self.app.error_response(error)
        response.headers = {**response.headers, **error.headers}
        return response

    def _admin(self, request: Request) -> Response:
        what = request.path.removeprefix(ADMIN_PREFIX).strip("/")
        try:
            if what == "faults":
                if request.method == "GET":
                    return Response(200, {"faults": self.faults.describe()})
                if request.method == "DELETE":
                    self.faults.clear()
                    return Response(200, {"faults": []})
                if request.method == "POST":
                    data = request.json()
                    items = data if isinstance(data, list) else [data]
                    added = [self.faults.add(Fault.from_json(item)) for item in items]
                    return Response(201, {"faults": [fault.describe() for fault in added]})
            if what == "clock":
                clock = self.app.clock
                if request.method == "POST":
                    if not isinstance(clock, ManualClock | AdvancingClock):
                        return Response(409, {"error": "this simulator runs on the system clock"})
                    clock.advance(float(request.json().get("advance", 0)))
                movable = isinstance(clock, ManualClock | AdvancingClock)
                return Response(200, {"now": clock.now(), "movable": movable})
            if what == "state" and request.method == "GET":
                return Response(200, self.app.state())
        except (ValueError, TypeError, re.error) as exc:
            return Response(400, {"error": str(exc)})
        return Response(404, {"error": f"no admin endpoint {request.method} {request.path}"})


@contextlib.contextmanager
def serving(app: SimulatorApp, *, tls: ServerTls | None = None) -> Iterator[SimulatorServer]:
    """Run `app` for the duration of a with-block."""
    server = SimulatorServer(app, tls=tls)
    server.start()
    try:
        yield server
    finally:
        server.stop()
