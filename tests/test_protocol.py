"""Framing, validation, secrets and the handshake; strangers cannot disturb a run."""

import asyncio
import contextlib
import copy
import ipaddress
import math
import os
import stat

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from learners.resources import Resources
from learners.sizing.base import Exhaustion
from orchestrator.agent import protocol
from orchestrator.agent.attempt import AttemptResult, AttemptSpec, Captured, Outcome
from orchestrator.agent.protocol import (
    AuthError,
    Channel,
    ProtocolError,
    Registration,
    SecretError,
    load_secret,
    write_secret,
)
from orchestrator.manager import Manager, host_address

SECRET = bytes(range(32))


def reader_with(data: bytes, eof: bool = True) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


async def test_frames_round_trip():
    message = {"t": "hb", "n": [1, 2.5, None, "é", b"\x00"]}
    assert await protocol.read_message(reader_with(protocol.pack(message))) == message


async def test_oversized_frame_is_refused_before_its_body_is_read():
    reader = reader_with((10**9).to_bytes(4, "big"), eof=False)  # no body ever comes
    with pytest.raises(ProtocolError, match="exceeds"):
        await asyncio.wait_for(protocol.read_message(reader, max_frame=1024), 1.0)


@pytest.mark.parametrize(
    "body",
    [
        b"\xc1",  # never used in msgpack
        msgpack.packb([1, 2]),  # not a map
        msgpack.packb({"x": 1}),  # no type
        msgpack.packb({"t": 3}),  # type not a string
        msgpack.packb({1: "a", "t": "hb"}),  # non-string key
        msgpack.packb({"t": "hb", "x": msgpack.ExtType(1, b"evil")}),
        msgpack.packb({"t": "hb"}) + b"trailing",
    ],
)
async def test_malformed_frames_are_protocol_errors(body):
    frame = len(body).to_bytes(4, "big") + body
    with pytest.raises(ProtocolError):
        await protocol.read_message(reader_with(frame))


async def test_truncated_frame_is_a_closed_connection():
    frame = protocol.pack({"t": "hb"})
    with pytest.raises(asyncio.IncompleteReadError):
        await protocol.read_message(reader_with(frame[:-1]))


def run_message(*items):
    return {"t": "run", "items": list(items)}


def test_specs_round_trip_with_unbounded_wall_time():
    specs = [
        AttemptSpec("a.1", 0, "echo 'x y' \"$HOME\"", Resources(1.5, 100, 10), "a"),
        AttemptSpec("b.2", 3, "true", Resources(2, 2000, 0, 60.0)),
    ]
    decoded = protocol.specs(run_message(*(protocol.spec_item(s) for s in specs)))
    assert decoded == specs
    assert math.isinf(decoded[0].allocation.wall)


@pytest.mark.parametrize(
    "item, error",
    [
        (["t", 0, "true", [1, 1, 1, math.inf], ""], "7 elements"),
        (["", 0, "true", [1, 1, 1, 1], "", "", []], "task_id"),
        (["t", -1, "true", [1, 1, 1, 1], "", "", []], "attempt"),
        (["t", True, "true", [1, 1, 1, 1], "", "", []], "attempt"),
        (["t", 0, "", [1, 1, 1, 1], "", "", []], "command"),
        (["t", 0, "true", [1, -1, 1, 1], "", "", []], "allocation"),
        (["t", 0, "true", [1, math.nan, 1, 1], "", "", []], "allocation"),
        (["t", 0, "true", [math.inf, 1, 1, 1], "", "", []], "finite"),
        (["t", 0, "true", [1, 1, 1], "", "", []], "allocation"),
        (["t", 0, "true", [1, "1", 1, 1], "", "", []], "allocation"),
        (["t", 0, 42, [1, 1, 1, 1], "", "", []], "command"),
        (["x" * 1000, 0, "true", [1, 1, 1, 1], "", "", []], "task_id"),
        (["t", 0, "true", [1, 1, 1, 1], "", 7, []], "workdir"),
        (["t", 0, "true", [1, 1, 1, 1], "", "/w", "out"], "outputs"),
        (["t", 0, "true", [1, 1, 1, 1], "", "/w", [3]], "outputs"),
        (["t", 0, "true", [1, 1, 1, 1], "", "/w", ["x" * 5000]], "outputs"),
    ],
)
def test_invalid_specs_are_refused(item, error):
    with pytest.raises(ProtocolError, match=error):
        protocol.specs(run_message(item))


def test_results_round_trip():
    results = [
        AttemptResult("a", 0, Outcome.SUCCESS, Resources(1.0, 20.5, 0.1, 2.0), exit_code=0),
        AttemptResult(
            "b",
            1,
            Outcome.EXHAUSTED,
            Resources(0.5, 300, 0, 1.0),
            exit_code=-15,
            exhaustion=Exhaustion("memory", 300.0),
            memory_series=(10.0, 300.0),
            sample_interval_s=1.0,
            output_tail="[leadtime] killed",
            stdout=Captured("first lines\n", "last lines\n", 12_345_678),
            stderr=Captured("all of it, ünïcode\n"),
            node="node12",
            sandbox="/scratch/leadtime-w/b.1",
            starved=True,
        ),
        AttemptResult("c", 2, Outcome.LOST, Resources(wall=0.0)),
    ]
    message = {"t": "result", "items": [protocol.result_item(r) for r in results]}
    assert protocol.results(message) == results


@pytest.mark.parametrize(
    "index, value, error",
    [
        (2, "fine", "outcome"),
        (5, ["bandwidth", 1.0], "resource"),
        (5, ["memory"], "exhaustion"),
        (6, [1.0, -2.0], "memory_series"),
        (4, 1.5, "exit_code"),
        (8, None, "output_tail"),
        (9, ["x" * (protocol.OUTPUT_HEAD + 1), "", 0], "stdout.head"),
        (9, ["", "x" * (protocol.OUTPUT_TAIL + 1), 0], "stdout.tail"),
        (10, ["", "", -1], "stderr.cut"),
        (10, ["", ""], "stderr"),
        (11, None, "node"),
        (12, "x" * (protocol.MAX_PATH + 1), "sandbox"),
        (13, 1, "starved"),
    ],
)
def test_invalid_results_are_refused(index, value, error):
    item = protocol.result_item(AttemptResult("a", 0, Outcome.SUCCESS, Resources(1, 1, 1, 1)))
    item[index] = value
    with pytest.raises(ProtocolError, match=error):
        protocol.results({"t": "result", "items": [item]})


class Sink:
    """A stream writer that keeps what is written."""

    def __init__(self):
        self.data = bytearray()

    def write(self, data):
        self.data += data

    def is_closing(self):
        return False


async def test_batches_keep_order_and_split_into_bounded_frames():
    sink = Sink()
    channel = Channel(asyncio.StreamReader(), sink)
    command = "x" * 100_000
    specs = [AttemptSpec(f"t{i}", 0, command, Resources(1, 1, 1)) for i in range(40)]
    for spec in specs:
        channel.post("run", protocol.spec_item(spec))
    channel.send("drain")  # flushes the batch first
    reader = reader_with(bytes(sink.data))
    received, frames = [], 0
    while (message := await protocol.read_message(reader)) and message["t"] == "run":
        frames += 1
        received.extend(protocol.specs(message))
    assert message["t"] == "drain"
    assert received == specs
    assert 2 < frames < 10  # about 1 MiB each


async def test_posts_in_one_loop_turn_share_a_frame():
    sink = Sink()
    channel = Channel(asyncio.StreamReader(), sink)
    for i in range(100):
        channel.post("cancel", protocol.key_item(f"t{i}", 0))
    await asyncio.sleep(0)
    reader = reader_with(bytes(sink.data))
    message = await protocol.read_message(reader)
    assert protocol.keys(message) == [(f"t{i}", 0) for i in range(100)]
    assert reader.at_eof()


async def test_a_lingering_post_waits_for_the_next_and_never_delays_an_urgent_one():
    sink = Sink()
    channel = Channel(asyncio.StreamReader(), sink)
    channel.post("cancel", protocol.key_item("a", 0), within=0.05)
    await asyncio.sleep(0.01)
    assert not sink.data  # still waiting for company
    channel.post("cancel", protocol.key_item("b", 0), within=0.05)  # due no later than a
    await asyncio.sleep(0.01)
    assert not sink.data
    channel.post("cancel", protocol.key_item("c", 0))  # urgent: all leave now, in one frame
    await asyncio.sleep(0)
    reader = reader_with(bytes(sink.data))
    assert protocol.keys(await protocol.read_message(reader)) == [("a", 0), ("b", 0), ("c", 0)]
    assert reader.at_eof()
    sent = len(sink.data)
    channel.post("cancel", protocol.key_item("d", 0), within=0.02)
    await asyncio.sleep(0.05)  # alone, it leaves when its time is up
    reader = reader_with(bytes(sink.data[sent:]))
    assert protocol.keys(await protocol.read_message(reader)) == [("d", 0)]


# --- secrets ---------------------------------------------------------------------------------


def test_secret_file_is_private_and_never_overwritten(tmp_path):
    path = write_secret(tmp_path / "secret", SECRET)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_secret(path, environ={}) == SECRET
    with pytest.raises(FileExistsError):
        write_secret(path, SECRET)


def test_secret_readable_by_others_is_refused(tmp_path):
    path = write_secret(tmp_path / "secret", SECRET)
    os.chmod(path, 0o644)
    with pytest.raises(SecretError, match="chmod 600"):
        load_secret(path, environ={})


def test_secret_from_the_environment():
    assert load_secret(environ={protocol.SECRET_ENV: SECRET.hex()}) == SECRET


@pytest.mark.parametrize(
    "environ, error",
    [
        ({}, "no secret"),
        ({protocol.SECRET_ENV: "not hex"}, "hexadecimal"),
        ({protocol.SECRET_ENV: "abcd"}, "shorter"),
    ],
)
def test_bad_secrets_are_user_errors(environ, error):
    with pytest.raises(SecretError, match=error):
        load_secret(environ=environ)


def test_missing_secret_file_names_it(tmp_path):
    with pytest.raises(SecretError, match="nope"):
        load_secret(tmp_path / "nope", environ={})


# --- handshake -------------------------------------------------------------------------------

REGISTRATION = Registration("w1", "job42", "node1", 123, Resources(4, 8000, 1000), 1.7e9)


async def connect(address):
    reader, writer = await asyncio.open_connection(*address)
    return Channel(reader, writer)


async def test_handshake_registers_a_worker_with_the_secret():
    joined = asyncio.Queue()
    async with Manager(SECRET, heartbeat_s=0.2, on_join=joined.put_nowait) as manager:
        channel = await connect(manager.address)
        welcome = await protocol.offer(channel, SECRET, REGISTRATION)
        worker = await joined.get()
        assert (worker.id, worker.pilot_id, worker.capacity) == (
            "w1",
            "job42",
            Resources(4, 8000, 1000),
        )
        assert welcome.heartbeat_s == 0.2
        await channel.close()


async def test_a_manager_that_closes_with_workers_connected_logs_no_error():
    """Ctrl-C with a worker still connected: its connection ends quietly (Python 3.11's stream
    server reports a connection task that ends cancelled as an unhandled error)."""
    errors = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: errors.append(context))
    joined = asyncio.Queue()
    manager = Manager(SECRET, on_join=joined.put_nowait)
    await manager.start()
    channel = await connect(manager.address)
    await protocol.offer(channel, SECRET, REGISTRATION)
    await joined.get()
    await manager.close()
    await asyncio.sleep(0.05)  # the connection task's done callbacks run
    assert errors == []
    await channel.close()


async def test_a_worker_with_the_wrong_secret_distrusts_the_manager():
    async with Manager(SECRET) as manager:
        channel = await connect(manager.address)
        with pytest.raises(AuthError, match="manager"):
            await protocol.offer(channel, bytes(32), REGISTRATION)
        await channel.close()


async def test_an_impostor_proof_is_refused():
    async with Manager(SECRET, handshake_timeout_s=1) as manager:
        channel = await connect(manager.address)
        channel.send("hello", v=protocol.VERSION, nonce=os.urandom(32))
        await channel.receive()  # the challenge; answer it without the secret
        fields = protocol._registration_fields(REGISTRATION)
        channel.send("register", proof=os.urandom(32), **fields)
        with pytest.raises(asyncio.IncompleteReadError):
            await channel.receive()
        assert manager.workers == {}
        assert manager.rejected == 1
        await channel.close()


async def test_a_silent_stranger_times_out_of_the_handshake():
    async with Manager(SECRET, handshake_timeout_s=0.2) as manager:
        reader, writer = await asyncio.open_connection(*manager.address)
        assert await asyncio.wait_for(reader.read(), 2.0) == b""  # closed by the manager
        assert manager.rejected == 1
        writer.close()


async def test_a_duplicate_worker_id_is_refused():
    async with Manager(SECRET) as manager:
        first = await connect(manager.address)
        await protocol.offer(first, SECRET, REGISTRATION)
        second = await connect(manager.address)
        with pytest.raises(ProtocolError, match="already registered"):
            await protocol.offer(second, SECRET, REGISTRATION)
        assert list(manager.workers) == ["w1"]
        await first.close()
        await second.close()


# --- fuzzing: whatever a peer sends, only ProtocolError comes out ----------------------------

junk = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=4)
    | st.binary(max_size=4),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=8,
)
VALID = {
    "run": (
        protocol.specs,
        protocol.spec_item(AttemptSpec("t", 0, "true", Resources(1, 2, 3), "c", "/w", ("o",))),
    ),
    "result": (
        protocol.results,
        protocol.result_item(
            AttemptResult(
                "t",
                0,
                Outcome.EXHAUSTED,
                Resources(1, 2, 3, 4),
                -9,
                Exhaustion("memory", 2.5),
                (1.0, 2.0),
                1.0,
                "tail",
            )
        ),
    ),
    "cancel": (protocol.keys, protocol.key_item("t", 0)),
}


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(sorted(VALID)), data=st.data())
def test_a_corrupted_item_is_parsed_or_refused_cleanly(kind, data):
    """Valid items with one field replaced (at any depth) by junk."""
    parse, item = VALID[kind]
    with contextlib.suppress(ProtocolError):
        parse({"t": kind, "items": [corrupted(item, data)]})


def corrupted(item: list, data) -> list:
    """A copy of ``item`` with one field replaced (at any depth) by junk."""
    item = copy.deepcopy(item)
    target = item
    while True:
        index = data.draw(st.integers(0, len(target) - 1))
        if isinstance(target[index], list) and data.draw(st.booleans()):
            target = target[index]
            continue
        target[index] = data.draw(junk)
        return item


USUAL_RESULT = protocol.result_item(
    AttemptResult(
        "t",
        3,
        Outcome.SUCCESS,
        Resources(1, 2, 3, 4),
        0,
        None,
        (1.0, 2.5),
        1.0,
        "tail",
        Captured("head", "end", 7),
        Captured(),
        "node1",
        "/scratch/t.3",
    )
)


@settings(max_examples=500, deadline=None)
@given(data=st.data())
def test_the_usual_results_one_test_decodes_are_those_the_field_checks_accept(data):
    """Whatever a result holds, the compound test answers as the checks field by field do:
    the same result, or it leaves the item to them (which refuse it or take it)."""
    item = data.draw(st.sampled_from([USUAL_RESULT, VALID["result"][1]]))
    if data.draw(st.booleans()):
        item = corrupted(item, data)
    quick = protocol._usual_result(item)
    try:
        checked = protocol._result(item)
    except ProtocolError:
        assert quick is None
    else:
        assert quick is None or quick == checked


def test_a_usual_result_takes_the_compound_test():
    assert protocol._usual_result(copy.deepcopy(USUAL_RESULT)) == protocol._result(USUAL_RESULT)


@settings(max_examples=100, deadline=None)
@given(items=junk)
def test_junk_batches_are_refused_cleanly(items):
    for parse, _ in VALID.values():
        with contextlib.suppress(ProtocolError):
            parse({"t": "x", "items": items})


@settings(max_examples=100, deadline=None)
@given(fields=st.dictionaries(st.sampled_from(["worker", "pilot", "capacity", "end", "pid"]), junk))
def test_a_corrupted_registration_is_refused_cleanly(fields):
    message = {"t": "register", **protocol._registration_fields(REGISTRATION), **fields}
    with contextlib.suppress(ProtocolError):
        protocol._registration(message)


def test_the_default_bind_address_is_an_address():
    ipaddress.ip_address(host_address())
