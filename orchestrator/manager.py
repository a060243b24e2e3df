"""The manager's end of the worker protocol: accept, authenticate, dispatch.

:class:`Manager` listens on one address, proves itself to each connecting
worker and makes it prove itself (see :mod:`orchestrator.agent.protocol`), then
exposes it as a :class:`RemoteWorker` whose ``start(spec, told)`` sends an
attempt and tells its result. A bad frame, a failed handshake or a stranger closes
that one connection, never the server.

A worker that disconnects or stays silent past the timeout keeps its attempts
running for a while: it is *absent* for ``reattach_s``, takes no new work,
and if it registers again meanwhile its attempts carry on where they were
(their results, and which of them it still runs, arrive when it does). Only
then is it gone, and what it was running comes back LOST. A manager that
resumes a dead one's run :meth:`expects <Manager.expect>` the attempts the
store says were running, on the workers that ran them, the same way.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
from collections.abc import Callable

from backends import clock
from learners.resources import Resources
from orchestrator.agent import protocol
from orchestrator.agent.attempt import AttemptResult, AttemptSpec
from orchestrator.agent.protocol import Channel, ProtocolError, Registration, lost
from orchestrator.pool import Told

log = logging.getLogger(__name__)

JoinCallback = Callable[["RemoteWorker"], None]
LeaveCallback = Callable[["RemoteWorker", str], None]


def host_address() -> str:
    """This host's address as other nodes reach it (its name resolved), else all addresses."""
    try:
        return socket.gethostbyname(socket.getfqdn())
    except OSError:
        return "0.0.0.0"


class RemoteWorker:
    """A registered worker, as the pool sees it.

    ``end_time`` is on the running loop's clock (``inf`` when the worker did
    not say). It runs many attempts at once; :meth:`stop` (or cancelling
    :meth:`run`'s future) stops one on the worker.
    """

    queues = True
    """It holds attempts sent while it is full until it has room."""

    def __init__(self, channel: Channel | None, registration: Registration) -> None:
        """``channel`` is None for a worker known only by its id, not (yet) connected."""
        self.id = registration.worker_id
        self.pilot_id = registration.pilot_id
        self.hostname = registration.hostname
        self.pid = registration.pid
        self.capacity = registration.capacity
        end = registration.end_time
        self.end_time = math.inf if end is None else clock.from_epoch(end)
        self.draining = False
        """True once the worker takes no more tasks (asked to drain, or its pilot ends soon)."""
        self._channel: Channel | None = channel
        """None while the worker is absent (disconnected, not yet gone)."""
        self._pending: dict[tuple[str, int], tuple[Told, float]] = {}
        """The attempts sent and not yet answered: whom to tell, and when each was sent."""
        self._gone: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._absence: asyncio.TimerHandle | None = None
        self._unconfirmed: set[tuple[str, int]] = set()
        """Attempts sent before the worker (re)registered: its ``attached`` says which it has."""
        self._vanished: str | None = None
        """Why its connection ended without a goodbye, while it is away."""

    def __repr__(self) -> str:
        return f"RemoteWorker({self.id!r}, pilot={self.pilot_id!r}, capacity={self.capacity})"

    @property
    def alive(self) -> bool:
        return not self._gone.done()

    @property
    def accepting(self) -> bool:
        return self.alive and self._channel is not None and not self.draining

    @property
    def running(self) -> int:
        """Attempts sent and not yet answered."""
        return len(self._pending)

    @property
    def attempts(self) -> dict[tuple[str, int], float]:
        """The attempts sent and not yet answered, and when each was sent (loop clock)."""
        return {key: start for key, (_, start) in self._pending.items()}

    def start(self, spec: AttemptSpec, told: Told) -> None:
        """Run ``spec`` on this worker; ``told`` its result, once: LOST if the worker leaves
        first, at once if it takes no attempts now.

        Raises ValueError for a spec the worker would refuse as malformed (which
        would cost the whole connection) or one already running here.
        """
        key = spec.key
        if key in self._pending:
            raise ValueError(f"attempt {spec.attempt} of {spec.task_id} is already on {self.id}")
        try:
            protocol.check_spec(spec)
        except ProtocolError as e:
            raise ValueError(f"attempt {spec.attempt} of {spec.task_id}: {e}") from None
        if not self.accepting or self._channel is None:
            reason = "worker is draining" if self.alive else f"worker left: {self._gone.result()}"
            told(lost(spec.task_id, spec.attempt, 0.0, reason))
            return
        self._pending[key] = (told, clock.now())
        self._channel.post("run", protocol.spec_item(spec))

    def run(self, spec: AttemptSpec) -> asyncio.Future[AttemptResult]:
        """:meth:`start` ``spec``, for a caller that awaits its result: cancelling the future
        stops the attempt."""
        future: asyncio.Future[AttemptResult] = asyncio.get_running_loop().create_future()

        def told(result: AttemptResult) -> None:
            if not future.done():
                future.set_result(result)

        def given_up(done: asyncio.Future[AttemptResult]) -> None:
            entry = self._pending.get(spec.key)
            if done.cancelled() and entry is not None and entry[0] is told:
                self.stop(spec.key)

        self.start(spec, told)
        future.add_done_callback(given_up)
        return future

    def follow(self, key: tuple[str, int], since: float, told: Told) -> None:
        """An attempt this worker was already running (sent ``since``, on the loop clock):
        ``told`` its result when the worker reports it, or says it no longer has it."""
        if not self.alive:
            told(lost(*key, clock.now() - since, f"worker left: {self._gone.result()}"))
            return
        self._pending[key] = (told, since)

    def stop(self, key: tuple[str, int]) -> None:
        """Nobody waits for attempt ``key`` any more: the worker stops it."""
        if self._pending.pop(key, None) is not None and self._channel is not None:
            self._channel.post("cancel", protocol.key_item(*key))

    async def drain(self) -> str:
        """Let the running attempts finish, then release the worker; why it left."""
        self.draining = True
        if self._channel is not None:
            self._channel.send("drain")
        return await self.wait_closed()

    async def shutdown(self, why: str = "shut down while absent") -> str:
        """Release the worker now: its running attempts come back LOST, for ``why`` if it is
        away (it cannot say); why it left."""
        self.draining = True
        if self._channel is not None:
            self._channel.send("shutdown")
        elif self.alive:
            self._leave(why)
        return await self.wait_closed()

    async def wait_closed(self) -> str:
        """Wait until the worker is gone; the reason."""
        return await asyncio.shield(self._gone)

    def _resolve(self, results: list[AttemptResult]) -> None:
        for result in results:
            entry = self._pending.pop((result.task_id, result.attempt), None)
            if entry is None:
                log.debug("%s: nobody waits for %s.%d", self.id, result.task_id, result.attempt)
            else:
                entry[0](result)

    def _attached(self, running: set[tuple[str, int]]) -> None:
        """The worker, registered again, runs ``running`` now (its results came before)."""
        now = clock.now()
        unconfirmed, self._unconfirmed = self._unconfirmed, set()
        for key in unconfirmed - running:
            if key in self._pending:
                told, start = self._pending.pop(key)
                told(lost(*key, now - start, "the worker no longer ran it"))
        for key in running - self._pending.keys():  # given up on meanwhile, or never ours
            if self._channel is not None:
                self._channel.post("cancel", protocol.key_item(*key))

    def _connect(self, channel: Channel) -> None:
        """The worker registered (again): what it had been sent is unconfirmed until it says."""
        if self._absence is not None:
            self._absence.cancel()
            self._absence = None
        self._channel = channel
        self._vanished = None
        self._unconfirmed = set(self._pending)

    def _disconnect(self, reason: str, grace_s: float, gone: Callable[[str], None]) -> None:
        """The connection ended: absent for ``grace_s``, then gone (``gone(reason)``)."""
        self._channel = None
        self._absence = asyncio.get_running_loop().call_later(grace_s, gone, reason)

    def _vanish(self, reason: str, grace_s: float, gone: Callable[[str], None]) -> None:
        """The connection ended without a goodbye: what it holds, should it not come back,
        is lost with it ``vanished`` (a task may have taken it down)."""
        self._vanished = reason
        self._disconnect(reason, grace_s, gone)

    def _leave(self, reason: str) -> None:
        if self._gone.done():
            return
        if self._absence is not None:
            self._absence.cancel()
            self._absence = None
        self._channel = None
        self._gone.set_result(reason)
        pending, self._pending = self._pending, {}
        now = clock.now()
        vanished = self._vanished
        if vanished is not None and vanished != reason:
            reason = f"{vanished}, then {reason}"
        held = frozenset(task_id for task_id, _ in pending)
        why, vanishes = f"worker left: {reason}", vanished is not None
        # Told once the worker's leave is (the manager's ``on_leave`` comes next): else the
        # room of a running attempt told lost first would start one that waited here.
        loop = asyncio.get_running_loop()
        for (task_id, attempt), (told, start) in pending.items():
            beside = held - {task_id} if vanishes else frozenset()
            ended = lost(task_id, attempt, now - start, why, vanished=vanishes, beside=beside)
            loop.call_soon(told, ended)


class Manager:
    """Accepts authenticated workers; tells ``on_join`` and ``on_leave`` about them."""

    def __init__(
        self,
        secret: bytes,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        heartbeat_s: float = 5.0,
        timeout_s: float | None = None,
        handshake_timeout_s: float = 10.0,
        reattach_s: float = 60.0,
        on_join: JoinCallback | None = None,
        on_leave: LeaveCallback | None = None,
    ) -> None:
        """``timeout_s`` (default four heartbeats) of silence and a worker is disconnected;
        ``reattach_s`` more without it registering again, and it is gone."""
        if len(secret) < protocol.MIN_SECRET_BYTES:
            raise ValueError(f"the secret must have at least {protocol.MIN_SECRET_BYTES} bytes")
        self.secret = secret
        self.host = host
        self.port = port
        self.heartbeat_s = heartbeat_s
        self.timeout_s = 4 * heartbeat_s if timeout_s is None else timeout_s
        self.handshake_timeout_s = handshake_timeout_s
        self.reattach_s = reattach_s
        self.on_join = on_join
        self.on_leave = on_leave
        self.workers: dict[str, RemoteWorker] = {}
        """The workers registered now, by id."""
        self.absent: dict[str, RemoteWorker] = {}
        """Workers disconnected less than ``reattach_s`` ago, by id: they may come back."""
        self._expected: dict[str, RemoteWorker] = {}
        """Workers a resumed run expects back, by id, until they register or time runs out."""
        self.rejected = 0
        """Connections refused so far (failed handshakes, bad frames before registering)."""
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task] = set()
        self._closing = False

    @property
    def address(self) -> tuple[str, int]:
        """The (host, port) the manager listens on (``port`` resolved once started)."""
        if self._server is None:
            raise RuntimeError("the manager is not started")
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    async def start(self) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        log.info("manager listening on %s:%d", *self.address)
        return self.address

    def expect(self, worker_id: str) -> RemoteWorker:
        """A worker of the run this manager resumes, which was running some of its attempts:
        it counts as absent until it registers; ``follow`` its attempts. Unless it registers
        within ``reattach_s``, they come back LOST."""
        worker = self.absent.get(worker_id) or self._expected.get(worker_id)
        if worker is None:
            registration = Registration(worker_id, "", "", 0, Resources(), None)
            worker = self._expected[worker_id] = RemoteWorker(None, registration)
            worker._disconnect("did not come back", self.reattach_s, self._gone(worker))
        return worker

    async def close(self) -> None:
        """Stop listening and drop every connection (the workers then try to reconnect)."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        while self._connections:
            for task in self._connections:
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def __aenter__(self) -> Manager:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if self._closing:  # accepted just before the server closed
            writer.close()
            return
        self._connections.add(task)
        channel = Channel(reader, writer, protocol.HANDSHAKE_MAX_FRAME)
        try:
            worker = await self._admit(channel)
            if worker is not None:
                await self._serve(worker, channel)
        except asyncio.CancelledError:
            pass  # closed by close(): ends quietly (Python 3.11's server logs a cancelled one)
        finally:
            self._connections.discard(task)
            await channel.close()

    async def _admit(self, channel: Channel) -> RemoteWorker | None:
        peer = channel.peer
        try:
            async with asyncio.timeout(self.handshake_timeout_s):
                registration = await protocol.accept(channel, self.secret)
        except (ProtocolError, asyncio.IncompleteReadError, ConnectionError, TimeoutError) as e:
            self.rejected += 1
            why = "handshake timed out" if isinstance(e, TimeoutError) else repr(e)
            log.warning("refused a connection from %s: %s", peer, why)
            return None
        if registration.worker_id in self.workers:
            self.rejected += 1
            message = f"worker id {registration.worker_id!r} is already registered"
            log.warning("refused %s: %s", peer, message)
            channel.send("error", message=message)
            return None
        protocol.welcome(channel, self.heartbeat_s, self.timeout_s)
        channel.max_frame = protocol.MAX_FRAME
        back = self.absent.pop(registration.worker_id, None)
        expected = self._expected.pop(registration.worker_id, None)
        if back is not None:
            back._connect(channel)
            self.workers[back.id] = back
            log.info("worker %s is back from %s", back.id, peer)
            return back
        worker = RemoteWorker(channel, registration)
        if expected is not None:  # a worker of the run this manager resumed
            worker._pending, expected._pending = expected._pending, {}
            worker._unconfirmed = set(worker._pending)
            expected._leave("registered")
        self.workers[worker.id] = worker
        log.info(
            "worker %s joined from %s (pilot %s, %s)", worker.id, peer, worker.pilot_id, worker
        )
        self._notify(self.on_join, worker)
        return worker

    async def _serve(self, worker: RemoteWorker, channel: Channel) -> None:
        reason = "connection closed"
        released = False
        watchdog = asyncio.create_task(channel.keep_alive(self.heartbeat_s, self.timeout_s))
        try:
            while True:
                message = await channel.receive()
                kind = message["t"]
                if kind == "result":
                    worker._resolve(protocol.results(message))
                elif kind == "attached":
                    worker._attached(protocol.attached(message))
                elif kind == "draining":
                    worker.draining = True
                    log.info("worker %s drains: %s", worker.id, protocol.reason(message))
                elif kind == "bye":
                    reason = f"released: {protocol.reason(message)}"
                    released = True
                    break
                elif kind != "hb":
                    raise ProtocolError(f"unexpected {kind!r} message from a worker")
        except (asyncio.IncompleteReadError, ConnectionError):
            reason = watchdog.result() if watchdog.done() else "disconnected"
        except ProtocolError as e:
            reason = f"protocol error: {e}"
            log.warning("worker %s: %s", worker.id, reason)
        except asyncio.CancelledError:
            reason = "manager closed"
            raise
        finally:
            watchdog.cancel()
            self.workers.pop(worker.id, None)
            if released or self._closing:
                self._gone(worker)(reason)
            else:
                log.info("worker %s disconnected (%s): absent for %g s", worker.id, reason,
                         self.reattach_s)  # fmt: skip
                self.absent[worker.id] = worker
                worker._vanish(reason, self.reattach_s, self._gone(worker))

    def _gone(self, worker: RemoteWorker) -> Callable[[str], None]:
        """What ends ``worker`` for good: its attempts LOST, the engine told."""

        def gone(reason: str) -> None:
            if self.absent.get(worker.id) is worker:
                del self.absent[worker.id]
            if self._expected.get(worker.id) is worker:
                del self._expected[worker.id]
            worker._leave(reason)
            log.info("worker %s left: %s", worker.id, reason)
            self._notify(self.on_leave, worker, reason)

        return gone

    def _notify(self, callback: Callable[..., None] | None, *args: object) -> None:
        if callback is None:
            return
        try:
            callback(*args)
        except Exception:
            log.exception("a worker callback failed")
