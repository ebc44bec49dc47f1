"""Bounded decompression of a record batch's records, for batches from producers.

A compressed batch of a few KiB can inflate to gigabytes (zeros compress about 30,000
to 1 with zstd), so the records of a batch from outside are never decompressed
unbounded. Invariant: `inflate` holds at most `prefix` + `limit` + 1 bytes of output
at a time, and raises InflateTooLarge as soon as the records would pass `limit`,
having decompressed no more than that; memory and CPU are bounded by the limit, not
by what the payload claims or holds.

How each of Kafka's codecs is bounded (the payload is everything after the batch's
61-byte header):
- gzip: zlib's streaming decompressor, asked for at most what is left of the limit.
- zstd and lz4 (Kafka's LZ4 frame format): cramjam decompresses into a buffer of a
  given size and stops with "failed to write whole buffer" when the output would not
  fit; the buffer starts small and grows fourfold up to limit + 1, so the work done is
  within a few times the output's size.
- snappy: the raw snappy format states its uncompressed length first, so each block
  is checked before it is decompressed: the xerial framing of Kafka's Java producer
  (a 16-byte header, then blocks of [int32 length, raw snappy]) block by block, or one
  raw block (librdkafka and others).
"""

from __future__ import annotations

import struct
import zlib

import cramjam

__all__ = ["InflateError", "InflateTooLarge", "inflate"]

GZIP, SNAPPY, LZ4, ZSTD = 1, 2, 3, 4
_XERIAL_HEADER = b"\x82SNAPPY\x00"
_XERIAL_HEADER_SIZE = 16  # magic (8), version (4), compatible version (4)
_BLOCK_LENGTH = struct.Struct(">i")
_FIRST_GUESS = 256 * 1024  # zstd/lz4: the first buffer, at least
_GROWTH = 4
_STEP = 1 << 20  # gzip: output asked for at a time
_BUFFER_FULL = "failed to write whole buffer"  # cramjam: the output does not fit


class InflateError(ValueError):
    """The payload does not decompress with its codec; the message says why."""


class InflateTooLarge(InflateError):
    """The payload decompresses to more than the limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"the records decompress to more than {limit} bytes")


def inflate(codec: int, payload: bytes | bytearray | memoryview, limit: int,
            prefix: bytes = b"") -> bytearray:
    """`prefix` followed by `payload` decompressed with Kafka codec `codec` (1 gzip, 2
    snappy, 3 lz4, 4 zstd); InflateTooLarge past `limit` bytes of records,
    InflateError when it does not decompress."""
    view = memoryview(payload)
    if codec == GZIP:
        return _gzip(view, limit, prefix)
    if codec == SNAPPY:
        return _snappy(view, limit, prefix)
    if codec == LZ4:
        return _into_buffer(cramjam.lz4, "lz4", view, limit, prefix)
    if codec == ZSTD:
        return _into_buffer(cramjam.zstd, "zstd", view, limit, prefix)
    raise InflateError(f"unknown compression codec {codec}")


def _gzip(payload: memoryview, limit: int, prefix: bytes) -> bytearray:
    out = bytearray(prefix)
    room = limit + 1  # one byte past the limit is enough to know it is passed
    data: bytes | memoryview = payload
    # Kafka's Java producer writes one gzip member; Java's GZIPInputStream (and so
    # Kafka) reads on through concatenated ones, and so does this.
    while data:
        stream = zlib.decompressobj(16 + zlib.MAX_WBITS)
        while not stream.eof:
            try:
                chunk = stream.decompress(data, min(_STEP, room))
            except zlib.error as error:
                raise InflateError(f"gzip: {error}") from None
            out += chunk
            room -= len(chunk)
            if room <= 0:
                raise InflateTooLarge(limit)
            data = stream.unconsumed_tail
            if not chunk and not data:
                raise InflateError("gzip: the compressed data ends before its stream does")
        data = stream.unused_data
    return out


def _into_buffer(module: object, name: str, payload: memoryview, limit: int,
                 prefix: bytes) -> bytearray:
    size = min(limit + 1, max(_FIRST_GUESS, _GROWTH * len(payload)))
    start = len(prefix)
    while True:
        out = bytearray(start + size)
        out[:start] = prefix
        try:
            written = int(module.decompress_into(  # type: ignore[attr-defined]
                payload, memoryview(out)[start:]))
        except cramjam.DecompressionError as error:
            if _BUFFER_FULL not in str(error):
                raise InflateError(f"{name}: {error}") from None
            if size > limit:
                raise InflateTooLarge(limit) from None
            del out  # before the larger one is made
            size = min(limit + 1, size * _GROWTH)
            continue
        if written > limit:
            raise InflateTooLarge(limit)
        del out[start + written:]
        return out


def _snappy(payload: memoryview, limit: int, prefix: bytes) -> bytearray:
    out = bytearray(prefix)
    if bytes(payload[:len(_XERIAL_HEADER)]) != _XERIAL_HEADER:
        _snappy_block(payload, out, limit, len(prefix))
        return out
    at = _XERIAL_HEADER_SIZE
    while at < len(payload):
        if len(payload) - at < _BLOCK_LENGTH.size:
            raise InflateError(f"snappy: a block length cut short at byte {at}")
        (length,) = _BLOCK_LENGTH.unpack_from(payload, at)
        at += _BLOCK_LENGTH.size
        if length < 0 or length > len(payload) - at:
            raise InflateError(f"snappy: a block of {length} bytes at byte {at}, "
                               f"{len(payload) - at} remain")
        _snappy_block(payload[at:at + length], out, limit, len(prefix))
        at += length
    return out


def _snappy_block(block: memoryview, out: bytearray, limit: int, start: int) -> None:
    """Append one raw snappy block to `out`, checking its stated length first."""
    try:
        size = int(cramjam.snappy.decompress_raw_len(block))
    except cramjam.DecompressionError as error:
        raise InflateError(f"snappy: {error}") from None
    if len(out) - start + size > limit:
        raise InflateTooLarge(limit)
    at = len(out)
    out += bytes(size)
    try:
        written = int(cramjam.snappy.decompress_raw_into(block, memoryview(out)[at:]))
    except cramjam.DecompressionError as error:
        raise InflateError(f"snappy: {error}") from None
    if written != size:
        raise InflateError(f"snappy: a block states {size} bytes and holds {written}")
