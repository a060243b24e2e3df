"""Manager <-> worker messages: framing, validation and authentication.

A frame is a 4-byte big-endian length and one msgpack map with a type ``t``
(never pickle: a frame from a stranger must not be able to run code). The
length is checked before the body is read, every field of every message is
checked before it is used, and any violation raises :class:`ProtocolError`,
on which the reader closes that one connection.

A connection starts with a mutual HMAC-SHA256 challenge-response over a
per-run secret, so a worker proves it belongs to the run and the manager
proves it is the run's manager, without the secret crossing the wire:

====================  ============================================================
worker -> manager     ``hello``     {v: version, nonce: 32 bytes}
manager -> worker     ``challenge`` {nonce: 32 bytes, proof: mac("manager", wn, mn)}
worker -> manager     ``register``  {proof: mac("worker", mn, wn), worker, pilot, host,
                                     pid, capacity: [cores, memory, disk], end: Unix s|nil}
manager -> worker     ``welcome``   {heartbeat: s, timeout: s}  or ``error`` {message}
worker -> manager     ``result``    the results the manager may not have (below)
worker -> manager     ``attached``  {items: [[task_id, attempt]]} the attempts it runs now
====================  ============================================================

A worker that lost its manager keeps its attempts running and, on each registration (with the
same manager or one resuming the run), first sends the results of attempts that ended since it
last spoke to a manager and of those that ended in the last minute before (the manager may have
died before recording them), then ``attached``: the manager then knows which of the attempts it
expected are still running, which ended, and which the worker does not have.

Then, in either direction unless noted (``items`` messages carry a batch, so
a burst of ready tasks costs one frame, not one per task):

====================  ============================================================
both                  ``hb``        {} (any frame proves liveness)
manager -> worker     ``run``       {items: [[task_id, attempt, command,
                                              [cores, memory, disk, wall], category,
                                              workdir, [output pattern...]]]}
manager -> worker     ``cancel``    {items: [[task_id, attempt]]}
worker -> manager     ``result``    {items: [[task_id, attempt, outcome, [c, m, d, wall],
                                              exit_code|nil, [resource, measured]|nil,
                                              [memory MB...]|nil, interval s|nil, tail,
                                              stdout, stderr, node, sandbox]]}
manager -> worker     ``drain``     {} finish running tasks, take no more, leave
manager -> worker     ``shutdown``  {} kill running tasks (reported lost), leave
worker -> manager     ``draining``  {reason} takes no more tasks
worker -> manager     ``bye``       {reason} leaving cleanly; the connection closes
====================  ============================================================

``tail`` is the worker's word on an attempt that did not succeed (why it stopped it, the last
lines of its output); ``stdout`` and ``stderr`` are ``[head, tail, cut]``: the stream's first
bytes (at most :data:`OUTPUT_HEAD`) and last bytes (at most :data:`OUTPUT_TAIL`) as text, and
the number of bytes between them left out, for every attempt; ``node`` is the host it ran on,
``sandbox`` its scratch directory there if it was kept (else empty). Units are those of
:mod:`learners.resources` (MB, seconds).

Version 3 added ``stdout``, ``stderr``, ``node`` and ``sandbox`` to ``result``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import math
import os
import secrets
import stat
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from backends import clock
from learners.resources import RESOURCES, Exhaustion, Resources
from orchestrator.agent.attempt import AttemptResult, AttemptSpec, Captured, Outcome

VERSION = 4
MAX_FRAME = 16 * 2**20
"""Largest frame accepted from an authenticated peer (bytes)."""
HANDSHAKE_MAX_FRAME = 4096
"""Largest frame accepted before the peer has proved it knows the secret."""
BATCH_BYTES = 2**20
"""A batch is split into frames of about this size."""
NONCE_BYTES = 32
SECRET_ENV = "LEADTIME_SECRET"
MIN_SECRET_BYTES = 16
MAX_ID = 256
MAX_COMMAND = 2**20
MAX_TAIL = 64 * 2**10
OUTPUT_HEAD = 8 * 2**10
"""The first bytes of an attempt's stdout (and of its stderr) its result carries."""
OUTPUT_TAIL = 32 * 2**10
"""The last bytes of an attempt's stdout (and of its stderr) its result carries."""
MAX_STREAM_BYTES = 2**62
"""The most bytes a result says were cut from a stream."""
MAX_SERIES = 2**16
MAX_PATH = 4096
MAX_OUTPUTS = 1024

_HEADER = 4


class ProtocolError(Exception):
    """A peer sent something that is not a valid message; close its connection."""


class AuthError(ProtocolError):
    """A peer failed the challenge-response: it does not hold the run's secret."""


class SecretError(ValueError):
    """The run's secret is missing, unreadable or malformed (a user error)."""


# --- the per-run secret ---------------------------------------------------------------------


def generate_secret() -> bytes:
    return secrets.token_bytes(32)


def write_secret(path: str | Path, secret: bytes) -> Path:
    """Write ``secret`` as hex to a new file only its owner can read."""
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret.hex() + "\n")
    return path


def load_secret(path: str | Path | None = None, environ: Mapping[str, str] = os.environ) -> bytes:
    """The secret from ``path`` (which must be private to its owner) or ``$LEADTIME_SECRET``."""
    if path is not None:
        path = Path(path)
        try:
            mode = path.stat().st_mode
            text = path.read_text()
        except OSError as e:
            raise SecretError(f"cannot read the secret file {path}: {e.strerror}") from e
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise SecretError(
                f"the secret file {path} is accessible to others (mode {stat.filemode(mode)}); "
                f"run: chmod 600 {path}"
            )
        source = str(path)
    elif SECRET_ENV in environ:
        text, source = environ[SECRET_ENV], f"${SECRET_ENV}"
    else:
        raise SecretError(f"no secret given: pass --secret-file PATH or set {SECRET_ENV}")
    try:
        secret = bytes.fromhex(text.strip())
    except ValueError as e:
        raise SecretError(f"the secret in {source} is not hexadecimal") from e
    if len(secret) < MIN_SECRET_BYTES:
        raise SecretError(f"the secret in {source} is shorter than {MIN_SECRET_BYTES} bytes")
    return secret


def _mac(secret: bytes, role: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(secret, role + first + second, hashlib.sha256).digest()


# --- framing --------------------------------------------------------------------------------


def _no_ext(code: int, data: bytes) -> Any:
    raise ProtocolError(f"msgpack extension type {code} is not allowed")


def pack(message: Mapping[str, Any]) -> bytes:
    """One frame holding ``message``."""
    body = msgpack.packb(message, use_bin_type=True)
    return len(body).to_bytes(_HEADER, "big") + body


async def read_message(reader: asyncio.StreamReader, max_frame: int = MAX_FRAME) -> dict:
    """The next message; :class:`ProtocolError` if it is too large or malformed.

    Raises :class:`asyncio.IncompleteReadError` when the peer closes the connection.
    """
    size = int.from_bytes(await reader.readexactly(_HEADER), "big")
    if size > max_frame:
        raise ProtocolError(f"frame of {size} bytes exceeds the limit of {max_frame}")
    body = await reader.readexactly(size)
    try:
        message = msgpack.unpackb(body, raw=False, strict_map_key=True, ext_hook=_no_ext)
    except ProtocolError:
        raise
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise ProtocolError(f"undecodable frame: {e}") from e
    if not isinstance(message, dict) or not isinstance(message.get("t"), str):
        raise ProtocolError("a frame must be a map with a string type 't'")
    return message


class Channel:
    """One connection: typed frames out (batched where asked), validated frames in.

    :meth:`post` queues an item of a batch message (``run``, ``result``,
    ``cancel``); everything posted during one turn of the event loop leaves
    in as few frames as fit. :meth:`send` flushes those first, so messages
    keep their order.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        max_frame: int = MAX_FRAME,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.max_frame = max_frame
        self.last_received = clock.now()
        self._batches: dict[str, list[bytes]] = {}
        self._flush: asyncio.Handle | None = None
        self._flush_due = -math.inf
        """When the scheduled flush runs; -inf: at the end of this turn of the loop."""

    @property
    def peer(self) -> str:
        peer = self.writer.get_extra_info("peername")
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)

    async def receive(self) -> dict:
        message = await read_message(self.reader, self.max_frame)
        self.last_received = clock.now()
        return message

    def send(self, type_: str, **fields: Any) -> None:
        self.flush()
        if not self.writer.is_closing():
            self.writer.write(pack({"t": type_, **fields}))

    def post(self, type_: str, item: list, within: float = 0.0) -> None:
        """Queue ``item``; it leaves at the end of this turn of the loop, or up to ``within``
        seconds later with what is posted meanwhile (fewer, larger frames)."""
        self._batches.setdefault(type_, []).append(msgpack.packb(item, use_bin_type=True))
        loop = asyncio.get_running_loop()
        due = loop.time() + within if within > 0 else -math.inf
        if self._flush is not None:
            if self._flush_due <= due:
                return
            self._flush.cancel()
        self._flush_due = due
        if within > 0:
            self._flush = loop.call_at(due, self.flush)
        else:
            self._flush = loop.call_soon(self.flush)

    def flush(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        batches, self._batches = self._batches, {}
        if self.writer.is_closing():
            return
        for type_, items in batches.items():
            start = 0
            while start < len(items):
                end, size = start, 0
                while end < len(items) and (end == start or size + len(items[end]) < BATCH_BYTES):
                    size += len(items[end])
                    end += 1
                self.writer.write(_batch_frame(type_, items[start:end]))
                start = end

    async def keep_alive(self, interval_s: float, timeout_s: float) -> str:
        """Send a heartbeat every ``interval_s``; once the peer has been silent for
        ``timeout_s``, drop the connection and say so.

        Time our own loop was stalled does not count against the peer: its
        frames may be waiting, unread, behind the stall.
        """
        while True:
            before = clock.now()
            await clock.sleep(interval_s)
            now = clock.now()
            stall = max(0.0, now - before - interval_s)
            silent = now - self.last_received - stall
            if silent > timeout_s:
                self.writer.transport.abort()
                return f"missed heartbeats (silent for {silent:.1f}s)"
            self.send("hb")

    async def close(self) -> None:
        self.flush()
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


def _batch_frame(type_: str, packed_items: list[bytes]) -> bytes:
    packer = msgpack.Packer(use_bin_type=True)
    body = b"".join(
        [
            packer.pack_map_header(2),
            packer.pack("t"),
            packer.pack(type_),
            packer.pack("items"),
            packer.pack_array_header(len(packed_items)),
            *packed_items,
        ]
    )
    return len(body).to_bytes(_HEADER, "big") + body


# --- validation -----------------------------------------------------------------------------


def _expect(message: dict, type_: str) -> dict:
    if message["t"] != type_:
        raise ProtocolError(f"expected a {type_!r} message, got {message['t']!r}")
    return message


def _field(message: dict, name: str, check: Callable[[Any, str], Any]) -> Any:
    """``message[name]`` validated by ``check``."""
    if name not in message:
        raise ProtocolError(f"{message.get('t')!r} message lacks {name!r}")
    return check(message[name], name)


def _text(max_len: int, *, empty: bool = True) -> Callable[[Any, str], str]:
    def check(value: Any, name: str) -> str:
        if not isinstance(value, str) or len(value) > max_len or (not empty and not value):
            raise ProtocolError(f"{name} must be a string of 1 to {max_len} characters")
        return value

    return check


def _integer(low: int, high: int) -> Callable[[Any, str], int]:
    def check(value: Any, name: str) -> int:
        if type(value) is not int or not low <= value <= high:
            raise ProtocolError(f"{name} must be an integer in [{low}, {high}]")
        return value

    return check


_NUMBERS = (int, float)
_FINITE = sys.float_info.max


def _number(low: float = 0.0, *, infinite: bool = False) -> Callable[[Any, str], float]:
    high = math.inf if infinite else _FINITE

    def check(value: Any, name: str) -> float:
        # Comparisons with NaN are false, so this refuses NaN too.
        if type(value) not in _NUMBERS or not low <= value <= high:
            bound = "" if infinite else " and finite"
            raise ProtocolError(f"{name} must be a number >= {low}{bound}")
        return float(value)

    return check


def _flag(value: Any, name: str) -> bool:
    if type(value) is not bool:
        raise ProtocolError(f"{name} must be true or false")
    return value


def _raw(size: int) -> Callable[[Any, str], bytes]:
    def check(value: Any, name: str) -> bytes:
        if not isinstance(value, bytes) or len(value) != size:
            raise ProtocolError(f"{name} must be {size} bytes")
        return value

    return check


def _optional(check: Callable[[Any, str], Any]) -> Callable[[Any, str], Any]:
    def maybe(value: Any, name: str) -> Any:
        return None if value is None else check(value, name)

    return maybe


def _array(value: Any, name: str, length: int | None = None, max_len: int = 2**20) -> list:
    if not isinstance(value, list) or (length is not None and len(value) != length):
        size = f"of {length} elements" if length is not None else ""
        raise ProtocolError(f"{name} must be an array {size}".rstrip())
    if len(value) > max_len:
        raise ProtocolError(f"{name} has more than {max_len} elements")
    return value


_task_id = _text(MAX_ID, empty=False)
_name = _text(MAX_ID)
_command = _text(MAX_COMMAND, empty=False)
_path = _text(MAX_PATH)
_tail = _text(MAX_TAIL)
_attempt = _integer(0, 2**31)
_exit_code = _optional(_integer(-(2**31), 2**31))
_amount = _number()
_wall = _number(infinite=True)
_interval = _optional(_number(1e-6))


def _is_resources(value: Any, wall: bool) -> bool:
    return (
        type(value) is list
        and len(value) == 3 + wall
        and all(type(v) in _NUMBERS and 0 <= v <= _FINITE for v in value[:3])
        and (not wall or (type(value[3]) in _NUMBERS and value[3] >= 0))
    )


def _resources(value: Any, name: str, *, wall: bool) -> Resources:
    """[cores, memory, disk] (finite, >= 0), then wall time (>= 0, maybe inf) if ``wall``."""
    if _is_resources(value, wall):
        return Resources(*map(float, value))
    shape = (
        "[cores, memory, disk, wall]: numbers >= 0, finite but wall"
        if wall
        else ("[cores, memory, disk]: finite numbers >= 0")
    )
    raise ProtocolError(f"{name} must be {shape}; got {value!r}"[:300])


def _items(message: dict) -> list:
    return _array(_field(message, "items", lambda v, n: v), "items")


# --- handshake ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Registration:
    """What a worker tells the manager about itself once authenticated."""

    worker_id: str
    pilot_id: str
    hostname: str
    pid: int
    capacity: Resources
    end_time: float | None
    """Unix time its pilot ends, if known."""


@dataclass(frozen=True, slots=True)
class Welcome:
    heartbeat_s: float
    timeout_s: float


def _registration_fields(r: Registration) -> dict[str, Any]:
    c = r.capacity
    return {
        "worker": r.worker_id,
        "pilot": r.pilot_id,
        "host": r.hostname,
        "pid": r.pid,
        "capacity": [c.cores, c.memory, c.disk],
        "end": r.end_time,
    }


def _registration(message: dict) -> Registration:
    return Registration(
        worker_id=_field(message, "worker", _task_id),
        pilot_id=_field(message, "pilot", _name),
        hostname=_field(message, "host", _name),
        pid=_field(message, "pid", _integer(0, 2**31)),
        capacity=_field(message, "capacity", lambda v, n: _resources(v, n, wall=False)),
        end_time=_field(message, "end", _optional(_number())),
    )


async def accept(channel: Channel, secret: bytes) -> Registration:
    """Manager side: authenticate a connecting worker and read its registration.

    The caller bounds the time this may take and answers with :func:`welcome`.
    """
    hello = _expect(await channel.receive(), "hello")
    version = _field(hello, "v", _integer(0, 2**31))
    if version != VERSION:
        raise ProtocolError(f"worker speaks protocol version {version}, manager {VERSION}")
    worker_nonce = _field(hello, "nonce", _raw(NONCE_BYTES))
    manager_nonce = secrets.token_bytes(NONCE_BYTES)
    proof = _mac(secret, b"manager", worker_nonce, manager_nonce)
    channel.send("challenge", nonce=manager_nonce, proof=proof)
    register = _expect(await channel.receive(), "register")
    expected = _mac(secret, b"worker", manager_nonce, worker_nonce)
    if not hmac.compare_digest(_field(register, "proof", _raw(32)), expected):
        raise AuthError("worker's proof does not match the run's secret")
    return _registration(register)


def welcome(channel: Channel, heartbeat_s: float, timeout_s: float) -> None:
    channel.send("welcome", heartbeat=heartbeat_s, timeout=timeout_s)


async def offer(channel: Channel, secret: bytes, registration: Registration) -> Welcome:
    """Worker side: authenticate to the manager (and it to us) and register."""
    worker_nonce = secrets.token_bytes(NONCE_BYTES)
    channel.send("hello", v=VERSION, nonce=worker_nonce)
    challenge = _expect(await channel.receive(), "challenge")
    manager_nonce = _field(challenge, "nonce", _raw(NONCE_BYTES))
    expected = _mac(secret, b"manager", worker_nonce, manager_nonce)
    if not hmac.compare_digest(_field(challenge, "proof", _raw(32)), expected):
        raise AuthError("the manager's proof does not match our secret: wrong secret or manager")
    proof = _mac(secret, b"worker", manager_nonce, worker_nonce)
    channel.send("register", proof=proof, **_registration_fields(registration))
    answer = await channel.receive()
    if answer["t"] == "error":
        raise ProtocolError(f"manager refused us: {_field(answer, 'message', _text(4096))}")
    _expect(answer, "welcome")
    return Welcome(
        heartbeat_s=_field(answer, "heartbeat", _number(1e-3)),
        timeout_s=_field(answer, "timeout", _number(1e-3)),
    )


# --- attempts -------------------------------------------------------------------------------


def spec_item(spec: AttemptSpec) -> list:
    a = spec.allocation
    return [
        spec.task_id,
        spec.attempt,
        spec.command,
        [a.cores, a.memory, a.disk, a.wall],
        spec.category,
        spec.workdir,
        list(spec.outputs),
    ]


def specs(message: dict) -> list[AttemptSpec]:
    """The attempts of a ``run`` message."""
    out = []
    for item in _items(message):
        task_id, attempt, command, allocation, category, workdir, outputs = _array(item, "spec", 7)
        out.append(
            AttemptSpec(
                task_id=_task_id(task_id, "task_id"),
                attempt=_attempt(attempt, "attempt"),
                command=_command(command, "command"),
                allocation=_resources(allocation, "allocation", wall=True),
                category=_name(category, "category"),
                workdir=_path(workdir, "workdir"),
                outputs=tuple(
                    _path(o, "outputs") for o in _array(outputs, "outputs", max_len=MAX_OUTPUTS)
                ),
            )
        )
    return out


def check_spec(spec: AttemptSpec) -> None:
    """Raise :class:`ProtocolError` if a worker would refuse ``spec``.

    Checked before sending, since a refused frame costs the whole connection.
    """
    a = spec.allocation
    if not (
        type(spec.task_id) is str
        and 0 < len(spec.task_id) <= MAX_ID
        and type(spec.attempt) is int
        and 0 <= spec.attempt <= 2**31
        and type(spec.command) is str
        and 0 < len(spec.command) <= MAX_COMMAND
        and type(spec.category) is str
        and len(spec.category) <= MAX_ID
        and type(spec.workdir) is str
        and len(spec.workdir) <= MAX_PATH
        and len(spec.outputs) <= MAX_OUTPUTS
        and all(type(o) is str and len(o) <= MAX_PATH for o in spec.outputs)
        and 0 <= a.cores <= _FINITE
        and 0 <= a.memory <= _FINITE
        and 0 <= a.disk <= _FINITE
        and a.wall >= 0
    ):
        specs({"t": "run", "items": [spec_item(spec)]})  # names what is wrong
        raise ProtocolError(f"invalid attempt spec {spec!r}"[:300])


def attached(message: dict) -> set[tuple[str, int]]:
    """The attempts a worker runs now, from its ``attached`` message."""
    return set(keys(message))


def key_item(task_id: str, attempt: int) -> list:
    return [task_id, attempt]


def keys(message: dict) -> list[tuple[str, int]]:
    """The (task_id, attempt) pairs of a ``cancel`` or ``attached`` message."""
    out = []
    for item in _items(message):
        task_id, attempt = _array(item, "key", 2)
        out.append((_task_id(task_id, "task_id"), _attempt(attempt, "attempt")))
    return out


def lost(
    task_id: str,
    attempt: int,
    wall: float,
    reason: str,
    *,
    vanished: bool = False,
    beside: frozenset[str] = frozenset(),
) -> AttemptResult:
    """The result of an attempt whose worker left (or would not start it): says nothing
    about the task's needs."""
    return AttemptResult(
        task_id=task_id,
        attempt=attempt,
        outcome=Outcome.LOST,
        peak=Resources(wall=wall),
        output_tail=f"[leadtime] {reason}",
        vanished=vanished,
        beside=beside,
    )


def result_item(r: AttemptResult) -> list:
    p = r.peak
    exhaustion = None if r.exhaustion is None else [r.exhaustion.resource, r.exhaustion.measured]
    return [
        r.task_id,
        r.attempt,
        r.outcome.value,
        [p.cores, p.memory, p.disk, p.wall],
        r.exit_code,
        exhaustion,
        None if r.memory_series is None else list(r.memory_series),
        r.sample_interval_s,
        r.output_tail,
        *([c.head, c.tail, c.cut] for c in (r.stdout, r.stderr)),
        r.node,
        r.sandbox,
        r.starved,
    ]


_output_head = _text(OUTPUT_HEAD)  # n bytes decode to at most n characters
_output_tail = _text(OUTPUT_TAIL)
_cut = _integer(0, MAX_STREAM_BYTES)


def _captured(value: Any, name: str) -> Captured:
    head, tail, cut = _array(value, name, 3)
    return Captured(
        _output_head(head, f"{name}.head"),
        _output_tail(tail, f"{name}.tail"),
        _cut(cut, f"{name}.cut"),
    )


_OUTCOMES = {o.value: o for o in Outcome}
_SILENT = ["", "", 0]
"""A stream that printed nothing, as a result carries it: most attempts' stdout and stderr,
decoded to one shared :data:`_NOTHING`."""
_NOTHING = Captured()


def _is_captured(value: Any) -> bool:
    return (
        type(value) is list
        and len(value) == 3
        and type(value[0]) is str
        and len(value[0]) <= OUTPUT_HEAD
        and type(value[1]) is str
        and len(value[1]) <= OUTPUT_TAIL
        and type(value[2]) is int
        and 0 <= value[2] <= MAX_STREAM_BYTES
    )


def _usual_result(item: Any) -> AttemptResult | None:
    """``item`` decoded if it is valid and no resource ran out; None for anything else, which
    :func:`_result` checks field by field to name what is wrong. The manager decodes every
    result, so the usual ones take one compound test here, as :func:`check_spec` does for
    what it sends."""
    if type(item) is not list or len(item) != 14:
        return None
    task_id, attempt, outcome, peak, exit_code, exhaustion, series, interval, *rest = item
    tail, stdout, stderr, node, sandbox, starved = rest
    if not (
        type(task_id) is str
        and 0 < len(task_id) <= MAX_ID
        and type(attempt) is int
        and 0 <= attempt <= 2**31
        and type(outcome) is str
        and outcome in _OUTCOMES
        and _is_resources(peak, True)
        and (exit_code is None or (type(exit_code) is int and -(2**31) <= exit_code <= 2**31))
        and exhaustion is None
        and (
            series is None
            or (
                type(series) is list
                and len(series) <= MAX_SERIES
                and all(type(v) in _NUMBERS and 0 <= v <= _FINITE for v in series)
            )
        )
        and (interval is None or (type(interval) in _NUMBERS and 1e-6 <= interval <= _FINITE))
        and type(tail) is str
        and len(tail) <= MAX_TAIL
        and _is_captured(stdout)
        and _is_captured(stderr)
        and type(node) is str
        and len(node) <= MAX_ID
        and type(sandbox) is str
        and len(sandbox) <= MAX_PATH
        and type(starved) is bool
    ):
        return None
    return AttemptResult(
        task_id=task_id,
        attempt=attempt,
        outcome=_OUTCOMES[outcome],
        peak=Resources(*map(float, peak)),
        exit_code=exit_code,
        memory_series=None if series is None else tuple(map(float, series)),
        sample_interval_s=None if interval is None else float(interval),
        output_tail=tail,
        stdout=Captured(*stdout) if stdout != _SILENT else _NOTHING,
        stderr=Captured(*stderr) if stderr != _SILENT else _NOTHING,
        node=node,
        sandbox=sandbox,
        starved=starved,
    )


def results(message: dict) -> list[AttemptResult]:
    """The results of a ``result`` message."""
    return [_usual_result(item) or _result(item) for item in _items(message)]


def _result(item: Any) -> AttemptResult:
    """One result, checked field by field: :class:`ProtocolError` names the first wrong one."""
    (
        task_id,
        attempt,
        outcome,
        peak,
        exit_code,
        exhaustion,
        series,
        interval,
        tail,
        stdout,
        stderr,
        node,
        sandbox,
        starved,
    ) = _array(item, "result", 14)
    if not isinstance(outcome, str) or outcome not in _OUTCOMES:
        raise ProtocolError(f"unknown outcome {outcome!r}")
    if exhaustion is not None:
        resource, measured = _array(exhaustion, "exhaustion", 2)
        if resource not in RESOURCES:
            raise ProtocolError(f"unknown resource {resource!r}")
        exhaustion = Exhaustion(resource, _wall(measured, "exhaustion.measured"))
    if series is not None:
        values = _array(series, "memory_series", max_len=MAX_SERIES)
        series = tuple(_amount(v, "memory_series") for v in values)
    return AttemptResult(
        task_id=_task_id(task_id, "task_id"),
        attempt=_attempt(attempt, "attempt"),
        outcome=_OUTCOMES[outcome],
        peak=_resources(peak, "peak", wall=True),
        exit_code=_exit_code(exit_code, "exit_code"),
        exhaustion=exhaustion,
        memory_series=series,
        sample_interval_s=_interval(interval, "sample_interval_s"),
        output_tail=_tail(tail, "output_tail"),
        stdout=_captured(stdout, "stdout"),
        stderr=_captured(stderr, "stderr"),
        node=_name(node, "node"),
        sandbox=_path(sandbox, "sandbox"),
        starved=_flag(starved, "starved"),
    )


def reason(message: dict) -> str:
    return _field(message, "reason", _text(4096))
