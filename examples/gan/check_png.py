#!/usr/bin/env python3
"""Reads a sample grid the gan example wrote, with Python's standard library
alone (an independent reader, not the example's writer), and checks it:

  check_png.py FILE

- the PNG signature, then chunks whose CRCs are right, IHDR first and IEND last;
- IHDR: 8-bit grayscale, not interlaced, 242 x 242 (8 x 8 tiles of 28 x 28
  with 2-pixel lines around and between them);
- the IDAT data inflates to 242 scanlines of a filter byte 0 and 242 pixels;
- the lines between the tiles are grey (128), and the tiles are images (not
  one flat value).
"""

import binascii
import struct
import sys
import zlib

TILES, TILE, PAD, LINE_VALUE = 8, 28, 2, 128
SIDE = TILES * TILE + (TILES + 1) * PAD


def fail(path, message):
    sys.exit(f"{path}: {message}")


def read_chunks(path, data):
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail(path, f"no PNG signature: {data[:8]!r}")
    at, chunks = 8, []
    while at < len(data):
        if at + 12 > len(data):
            fail(path, f"a chunk is cut short at byte {at}")
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind = data[at + 4 : at + 8]
        body = data[at + 8 : at + 8 + length]
        if len(body) != length or at + 12 + length > len(data):
            fail(path, f"chunk {kind!r} is cut short")
        (crc,) = struct.unpack(">I", data[at + 8 + length : at + 12 + length])
        if binascii.crc32(kind + body) != crc:
            fail(path, f"chunk {kind!r}: CRC {crc:08x}, computed {binascii.crc32(kind + body):08x}")
        chunks.append((kind, body))
        at += 12 + length
    return chunks


def main():
    path = sys.argv[1]
    with open(path, "rb") as f:
        chunks = read_chunks(path, f.read())
    kinds = [kind for kind, _ in chunks]
    if not chunks or kinds[0] != b"IHDR" or kinds[-1] != b"IEND" or b"IDAT" not in kinds:
        fail(path, f"chunks {kinds}: expected IHDR first, IDAT, IEND last")
    width, height, depth, colour, compression, filtering, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    if (width, height) != (SIDE, SIDE):
        fail(path, f"{width} x {height}, expected {SIDE} x {SIDE}")
    if (depth, colour, compression, filtering, interlace) != (8, 0, 0, 0, 0):
        fail(path, f"IHDR {depth, colour, compression, filtering, interlace}: expected 8-bit grayscale, not interlaced")
    raw = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
    if len(raw) != height * (width + 1):
        fail(path, f"{len(raw)} bytes of scanlines, expected {height * (width + 1)}")
    rows = [raw[y * (width + 1) : (y + 1) * (width + 1)] for y in range(height)]
    if any(row[0] != 0 for row in rows):
        fail(path, "a scanline's filter type is not 0")
    pixels = [row[1:] for row in rows]

    on_line = [(i % (TILE + PAD)) < PAD for i in range(SIDE)]
    lines = {pixels[y][x] for y in range(SIDE) for x in range(SIDE) if on_line[y] or on_line[x]}
    if lines != {LINE_VALUE}:
        fail(path, f"the lines between the tiles hold {sorted(lines)}, expected only {LINE_VALUE}")
    for ty in range(TILES):
        for tx in range(TILES):
            y0, x0 = PAD + ty * (TILE + PAD), PAD + tx * (TILE + PAD)
            tile = {pixels[y][x] for y in range(y0, y0 + TILE) for x in range(x0, x0 + TILE)}
            if len(tile) < 2:
                fail(path, f"tile ({ty}, {tx}) is one flat value {tile}")
    print(f"{path}: a valid {width} x {height} grayscale PNG of {TILES} x {TILES} samples")


if __name__ == "__main__":
    main()
