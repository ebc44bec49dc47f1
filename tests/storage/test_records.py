"""Kafka's v2 record-batch format: encoding, decoding, header parsing and validation."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactlog.storage.records import (
    CODECS,
    CRC_START,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_V2,
    BatchError,
    ProducerRecord,
    Record,
    check_batch,
    decode_batch,
    encode_batch,
    iter_batches,
    parse_header,
    set_base_offset,
)

NOW_MS = 1_700_000_000_000

optional_bytes = st.one_of(st.none(), st.just(b""), st.binary(max_size=64))
headers = st.lists(
    st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=16))), max_size=3
).map(tuple)
producer_records = st.builds(
    ProducerRecord,
    key=optional_bytes,
    value=optional_bytes,
    headers=headers,
    timestamp=st.one_of(st.none(), st.integers(min_value=0, max_value=2**45)),
)


def expected_records(records: list[ProducerRecord], base_offset: int, now_ms: int) -> list[Record]:
    return [
        Record(
            base_offset + i,
            r.timestamp if r.timestamp is not None else now_ms,
            r.key,
            r.value,
            tuple(r.headers),
        )
        for i, r in enumerate(records)
    ]


SAMPLE = [
    ProducerRecord(b"k1", b"v1", (("h", b"x"),), 1000),
    ProducerRecord(None, None),
    ProducerRecord(b"", b"", (("n", None), ("", b"")), 900),
    ProducerRecord(b"\x00\xff\x80", bytes(range(256)), (), 2000),
]


@settings(max_examples=100, deadline=None)
@given(
    records=st.lists(producer_records, min_size=1, max_size=20),
    base_offset=st.integers(min_value=0, max_value=2**40),
)
def test_encode_decode_round_trip(records: list[ProducerRecord], base_offset: int) -> None:
    batch = encode_batch(records, base_offset, NOW_MS)
    assert check_batch(batch, 0, len(batch)).base_offset == base_offset
    assert decode_batch(batch) == expected_records(records, base_offset, NOW_MS)


def test_encode_needs_records() -> None:
    with pytest.raises(ValueError):
        encode_batch([], 0, NOW_MS)


def test_parse_header_fields() -> None:
    batch = encode_batch(SAMPLE, 42, NOW_MS)
    header = parse_header(batch)
    assert HEADER_SIZE == 61
    assert header.base_offset == 42
    assert header.length == len(batch) - LOG_OVERHEAD
    assert header.size == len(batch)
    assert header.magic == MAGIC_V2
    assert header.record_count == len(SAMPLE)
    assert header.last_offset_delta == len(SAMPLE) - 1
    assert header.last_offset == 42 + len(SAMPLE) - 1
    # baseTimestamp is the first record's; maxTimestamp the largest (the None one is NOW_MS).
    assert header.base_timestamp == 1000
    assert header.max_timestamp == NOW_MS
    assert header.producer_id == -1
    assert header.producer_epoch == -1
    assert header.base_sequence == -1
    assert header.codec == CODECS["none"]
    assert not header.is_control
    # The header found by parse_header agrees with the raw big-endian fields.
    assert struct.unpack_from(">q", batch, 0)[0] == 42
    assert struct.unpack_from(">i", batch, 8)[0] == len(batch) - LOG_OVERHEAD
    assert batch[16] == MAGIC_V2
    assert check_batch(batch, 0, len(batch)) == header


def test_parse_header_at_position() -> None:
    first = encode_batch(SAMPLE[:1], 0, NOW_MS)
    second = encode_batch(SAMPLE, 1, NOW_MS)
    buf = bytes(first + second)
    assert parse_header(buf, len(first)).base_offset == 1
    assert check_batch(buf, len(first), len(buf)).record_count == len(SAMPLE)
    assert [(pos, h.base_offset) for pos, h in iter_batches(buf)] == [(0, 0), (len(first), 1)]
    # A partial batch at the end is a tail, not a batch.
    assert [pos for pos, _ in iter_batches(buf[:-1])] == [0]
    assert [pos for pos, _ in iter_batches(buf[: len(first) + HEADER_SIZE - 1])] == [0]


def test_set_base_offset_keeps_crc_valid() -> None:
    batch = encode_batch(SAMPLE, 0, NOW_MS)
    set_base_offset(batch, 1_000_000)
    header = check_batch(batch, 0, len(batch))
    assert header.base_offset == 1_000_000
    assert [r.offset for r in decode_batch(batch)] == list(range(1_000_000, 1_000_004))


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_flipped_byte_is_caught(data: st.DataObject) -> None:
    batch = encode_batch(SAMPLE, 7, NOW_MS)
    # baseOffset (0..7) and partitionLeaderEpoch (12..15) are outside the CRC by design;
    # every other byte is covered by the length, magic or CRC32C checks.
    position = data.draw(
        st.integers(min_value=8, max_value=len(batch) - 1).filter(lambda p: not 12 <= p < 16)
    )
    flip = data.draw(st.integers(min_value=1, max_value=255))
    damaged = bytearray(batch)
    damaged[position] ^= flip
    with pytest.raises(BatchError):
        check_batch(damaged, 0, len(damaged))


def test_flipped_payload_byte_reports_crc() -> None:
    batch = encode_batch(SAMPLE, 0, NOW_MS)
    damaged = bytearray(batch)
    damaged[-3] ^= 0x01
    with pytest.raises(BatchError, match="CRC32C mismatch"):
        check_batch(damaged, 0, len(damaged))
    damaged = bytearray(batch)
    damaged[CRC_START] ^= 0x10  # the attributes, first byte under the CRC
    with pytest.raises(BatchError):
        check_batch(damaged, 0, len(damaged))


def test_bytes_outside_crc_do_not_fail() -> None:
    batch = encode_batch(SAMPLE, 0, NOW_MS)
    changed = bytearray(batch)
    changed[3] ^= 0xFF  # base offset
    changed[13] ^= 0xFF  # partition leader epoch
    check_batch(changed, 0, len(changed))


@pytest.mark.parametrize("cut", [0, 1, 12, HEADER_SIZE - 1, HEADER_SIZE, -10, -1])
def test_truncation_is_caught(cut: int) -> None:
    batch = bytes(encode_batch(SAMPLE, 0, NOW_MS))
    length = cut if cut >= 0 else len(batch) + cut
    truncated = batch[:length]
    with pytest.raises(BatchError, match="truncated"):
        check_batch(truncated, 0, len(truncated))
    # The same with the bytes present in the buffer but `end` before the batch's end.
    with pytest.raises(BatchError, match="truncated"):
        check_batch(batch, 0, length)


@pytest.mark.parametrize("magic", [0, 1, 3, 255])
def test_bad_magic_is_caught(magic: int) -> None:
    batch = encode_batch(SAMPLE, 0, NOW_MS)
    batch[16] = magic
    with pytest.raises(BatchError, match="magic"):
        check_batch(batch, 0, len(batch))


def test_length_smaller_than_header_is_caught() -> None:
    batch = encode_batch(SAMPLE, 0, NOW_MS)
    struct.pack_into(">i", batch, 8, 10)
    with pytest.raises(BatchError):
        check_batch(batch, 0, len(batch))


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_every_codec_round_trips(codec: str) -> None:
    records = [
        ProducerRecord(b"key-%d" % i, b"value %d " % i * 40, (("i", str(i).encode()),), 5000 + i)
        for i in range(50)
    ]
    records.append(ProducerRecord(None, None, (("n", None),), 6000))
    records.append(ProducerRecord(b"", b"", (), None))
    batch = encode_batch(records, 123, NOW_MS, codec=codec)
    header = check_batch(batch, 0, len(batch))
    assert header.codec == CODECS[codec]
    assert header.record_count == len(records)
    assert header.last_offset == 123 + len(records) - 1
    assert decode_batch(batch) == expected_records(records, 123, NOW_MS)
    if codec != "none":
        plain = encode_batch(records, 123, NOW_MS, codec="none")
        assert len(batch) < len(plain), "compressible records should shrink"


@pytest.mark.parametrize("codec", sorted(set(CODECS) - {"none"}))
def test_compressed_batch_damage_is_caught(codec: str) -> None:
    batch = encode_batch(SAMPLE * 10, 0, NOW_MS, codec=codec)
    batch[HEADER_SIZE + 2] ^= 0x40
    with pytest.raises(BatchError, match="CRC32C"):
        check_batch(batch, 0, len(batch))
