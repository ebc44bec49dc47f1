"""Compressed Produce batches that inflate far past their size (issue 25, item 2).

A producer's batch is checked against the topic's `max.message.bytes` on its size as
sent, before anything is decompressed, and a compressed batch is decompressed by a
bounded decompressor that stops once the records pass `max_uncompressed_batch_bytes`,
whatever the codec (gzip, snappy, lz4, zstd). Both refusals are Kafka's
RecordTooLargeException, MESSAGE_TOO_LARGE (10), with a message naming the partition
and the limit. The server's memory is read from the process (/proc) around the
request.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import cramjam
import crc32c
import pytest
from kio.schema.errors import ErrorCode

from compactlog.storage.records import CODECS, CRC_START, HEADER
from support.hostile_support import PRODUCE, TOPIC, hostile_server
from support.process_usage import MIB, Usage
from support.wire import Wire, request_frame

ZEROS = bytes(MIB)


def _varint(value: int) -> bytes:
    """Kafka's zigzag varint."""
    value = (value << 1) ^ (value >> 63)
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _records(count: int, value: bytes) -> Iterator[bytes]:
    """`count` v2 records with key b"k" and `value` each, one at a time."""
    for delta in range(count):
        body = (b"\0" + _varint(0) + _varint(delta) + _varint(1) + b"k"
                + _varint(len(value)) + value + _varint(0))
        yield _varint(len(body)) + body


def compress(codec: str, chunks: Iterator[bytes]) -> bytes:
    """The chunks compressed as a Kafka producer would, streaming (the test never holds
    what they inflate to)."""
    if codec == "gzip":
        gzip = zlib.compressobj(9, zlib.DEFLATED, 31)
        return b"".join(gzip.compress(chunk) for chunk in chunks) + gzip.flush()
    if codec == "snappy":  # xerial blocks of 32 KiB, as Kafka's Java producer writes
        out = [b"\x82SNAPPY\x00", struct.pack(">ii", 1, 1)]
        pending = b""
        for chunk in chunks:
            pending += chunk
            while len(pending) >= 32 * 1024:
                block = bytes(cramjam.snappy.compress_raw(pending[:32 * 1024]))
                out += [struct.pack(">i", len(block)), block]
                pending = pending[32 * 1024:]
        if pending:
            block = bytes(cramjam.snappy.compress_raw(pending))
            out += [struct.pack(">i", len(block)), block]
        return b"".join(out)
    streaming = (cramjam.lz4.Compressor(content_checksum=False, block_linked=False)
                 if codec == "lz4" else cramjam.zstd.Compressor())
    for chunk in chunks:
        streaming.compress(chunk)
    return bytes(streaming.finish())


def batch_of(codec: str, count: int, value: bytes) -> bytes:
    """A whole v2 batch of `count` records holding `value`, compressed with `codec`."""
    payload = compress(codec, _records(count, value))
    header = bytearray(HEADER.pack(0, HEADER.size - 12 + len(payload), -1, 2, 0,
                                   CODECS[codec], count - 1, 1_700_000_000_000,
                                   1_700_000_000_000, -1, -1, -1, count))
    batch = header + payload
    struct.pack_into(">I", batch, 17, crc32c.crc32c(memoryview(batch)[CRC_START:]))
    return bytes(batch)


def produce(wire: Wire, records: bytes) -> object:
    wire.send(request_frame(PRODUCE, 9, {
        "acks": -1, "timeout": timedelta(seconds=30),
        "topic_data": [{"name": TOPIC, "partition_data": [{"index": 0,
                                                           "records": records}]}]}, 5))
    _, body = wire.response(PRODUCE, 9)
    return body.responses[0].partition_responses[0]


def test_a_zstd_batch_that_inflates_to_128_mib_is_refused_while_decompressing(
        tmp_path: Path) -> None:
    """A 5.6 KB zstd batch of 128 records of 1 MiB of zeros. Before: decompressed whole
    before any check and appended (NONE), the server's peak RSS up by 257 MiB. Now
    decompression stops at max_uncompressed_batch_bytes (32 MiB by default, +35 MiB of
    peak RSS) and the batch is refused with MESSAGE_TOO_LARGE naming the partition and
    the limit."""
    bomb = batch_of("zstd", 128, ZEROS)
    assert len(bomb) < 64 * 1024
    with hostile_server(tmp_path) as hostile, Wire(hostile.address(), timeout=60) as wire:
        with Usage(hostile.pid) as usage:
            answer = produce(wire, bomb)
        print(f"zstd batch of {len(bomb)} bytes inflating to 128 MiB: {usage}")
        assert answer.error_code is ErrorCode.message_too_large, answer
        assert answer.error_message is not None
        assert "t/0" in answer.error_message
        assert "max_uncompressed_batch_bytes=33554432" in answer.error_message
        assert usage.peak_growth < 48 * MIB, f"{usage}"
        # Nothing was appended, and a batch within the limits still is.
        fine = produce(wire, batch_of("zstd", 4, b"z" * 1000))
        assert fine.error_code is ErrorCode.none and fine.base_offset == 0


def test_max_message_bytes_is_checked_before_decompressing(tmp_path: Path) -> None:
    """Kafka checks max.message.bytes against the batch as sent and answers
    MESSAGE_TOO_LARGE. Before: INVALID_RECORD, after the records were decompressed."""
    random = os.urandom(20_000)  # does not compress
    with hostile_server(tmp_path, topic_config={"max.message.bytes": "10000"}) as hostile, \
            Wire(hostile.address()) as wire:
        answer = produce(wire, batch_of("gzip", 1, random))
        assert answer.error_code is ErrorCode.message_too_large, answer
        assert "t/0" in answer.error_message
        assert "max.message.bytes=10000" in answer.error_message


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_bounded_decompression_stops_at_the_limit(codec: str) -> None:
    """Each codec's decompressor stops at the limit: 64 MiB of zeros against a 1 MiB
    limit costs this process a few MiB, and what fits decompresses exactly."""
    from compactlog.storage.inflate import InflateTooLarge, inflate

    bomb = compress(codec, iter([ZEROS] * 64))
    with Usage(os.getpid()) as usage, pytest.raises(InflateTooLarge, match="1048576"):
        inflate(CODECS[codec], bomb, MIB)
    assert usage.peak_growth < 16 * MIB, f"{codec}: {usage}"
    small = b"".join(_records(50, b"v" * 100))
    assert bytes(inflate(CODECS[codec], compress(codec, iter([small])), MIB)) == small
    assert bytes(inflate(CODECS[codec], compress(codec, iter([small])), len(small))) == small
    with pytest.raises(InflateTooLarge):
        inflate(CODECS[codec], compress(codec, iter([small])), len(small) - 1)
