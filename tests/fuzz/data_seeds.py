#!/usr/bin/env python3
"""Writes the seeds of the image and tar_shard fuzz targets:

    python3 tests/fuzz/data_seeds.py build/tests/fuzz/fulgor_fuzz_replay tests/fuzz/corpus

The valid images are libjpeg-turbo's and libpng's (fulgor_fuzz_replay
--write-image-seeds); the valid shards are Python's tarfile's in each of its
formats, as WebDataset's writer and fulgor-shard make them, some followed by
their index (the tar_shard target splits the input where an index's first
line starts). The other seeds are those files broken in the ways a reader of
files from elsewhere must refuse (docs/data.md, "Files from elsewhere"):
declared sizes far past the data or the pixel limit, truncation, fields that
overflow, members that are no files, names that climb out of the shard, and
index lines that point past the shard's end.
"""

import io
import os
import struct
import subprocess
import sys
import tarfile
import zlib


# Images.

def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_declaring(png, width, height):
    """The PNG with its IHDR's size replaced, the chunk's CRC still valid."""
    ihdr = b"IHDR" + struct.pack(">II", width, height) + png[24:29]
    return png[:12] + ihdr + struct.pack(">I", zlib.crc32(ihdr)) + png[33:]


def png_of(width, height, color_type, rows, extra_chunks=b""):
    ihdr = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + extra_chunks +
            png_chunk(b"IDAT", zlib.compress(rows, 9)) + png_chunk(b"IEND", b""))


def jpeg_declaring(jpeg, width, height):
    """The JPEG with its frame header's (SOF0 or SOF2) size replaced."""
    for marker in (b"\xff\xc0", b"\xff\xc2"):
        at = jpeg.find(marker)
        if at >= 0:
            return jpeg[:at + 5] + struct.pack(">HH", height, width) + jpeg[at + 9:]
    raise ValueError("no frame header")


def image_seeds(folder):
    read = lambda name: open(os.path.join(folder, name), "rb").read()
    png, jpeg = read("valid_rgb.png"), read("valid_420.jpg")
    progressive = read("valid_progressive.jpg")
    sos, sof, idat = jpeg.find(b"\xff\xda"), jpeg.find(b"\xff\xc0"), png.find(b"IDAT")
    return {
        # Pixel bombs: a few bytes declaring gigabytes.
        "png_declares_60000x60000.png": png_declaring(png, 60000, 60000),
        "png_declares_65535x21845.png": png_declaring(png, 65535, 21845),
        "png_declares_2pow31_wide.png": png_declaring(png, 2 ** 31, 1),
        "png_declares_4294967295_wide.png": png_declaring(png, 2 ** 32 - 1, 2 ** 32 - 1),
        "png_declares_zero_width.png": png_declaring(png, 0, 12),
        "png_declares_more_rows.png": png_declaring(png, 20, 1000),
        "jpeg_declares_65500x65500.jpg": jpeg_declaring(jpeg, 65500, 65500),
        "jpeg_declares_65535x1.jpg": jpeg_declaring(jpeg, 65535, 1),
        "jpeg_declares_zero_height.jpg": jpeg_declaring(jpeg, 40, 0),
        "jpeg_declares_more_rows.jpg": jpeg_declaring(jpeg, 40, 3000),
        "progressive_declares_8000x8000.jpg": jpeg_declaring(progressive, 8000, 8000),
        # Truncated and corrupt.
        "png_truncated_half.png": png[:len(png) // 2],
        "png_truncated_in_ihdr.png": png[:20],
        "png_signature_only.png": png[:8],
        "png_crc_wrong.png": png[:idat + 8] + bytes([png[idat + 8] ^ 1]) + png[idat + 9:],
        "png_no_iend.png": png[:-12],
        "png_palette_without_plte.png": png_of(4, 4, 3, b"\0\0\0\0\0" * 4),
        "png_too_much_data.png": png_of(4, 4, 2, b"\0" * (20 << 20)),
        "png_too_little_data.png": png_of(64, 64, 2, b"\0" * 100),
        "png_text_chunks.png": png_of(2, 2, 0, b"\0\0\0" * 2,
                                      png_chunk(b"tEXt", b"k\0" + b"v" * 8) * 1200),
        "jpeg_truncated_half.jpg": jpeg[:len(jpeg) // 2],
        "jpeg_truncated_after_scan_header.jpg": jpeg[:sos + 14],
        "jpeg_no_eoi.jpg": jpeg[:-2],
        "jpeg_signature_only.jpg": b"\xff\xd8\xff",
        "jpeg_cut_before_frame_header.jpg": jpeg[:sof],
        "jpeg_tables_only.jpg": jpeg[:sof] + b"\xff\xd9",
        "jpeg_scan_data_zeroed.jpg": jpeg[:sos + 14] + b"\0" * (len(jpeg) - sos - 16) + b"\xff\xd9",
        "progressive_truncated.jpg": progressive[:len(progressive) * 2 // 3],
        "not_an_image.txt": b"GIF89a, which fulgor does not decode\n",
        "empty": b"",
    }


# Tar shards.

def cls(target):
    return str(target).encode() + b"\n"


def shard(samples, fmt=tarfile.PAX_FORMAT):
    """A shard as WebDataset's TarWriter writes it: each sample's members in turn."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for key, members in samples:
            for ext, data in members:
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                info.mtime = 1700000000
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def index_of(data):
    """The index TarShards::write_index writes for the shard `data`."""
    lines, image, target = [], None, None
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = tar.getmembers()
    for i, m in enumerate(members):
        base, ext = m.name.rsplit(".", 1)
        if ext in ("jpg", "jpeg", "png"):
            image = m
        if ext == "cls":
            target = int(data[m.offset_data:m.offset_data + m.size])
        if i + 1 == len(members) or members[i + 1].name.rsplit(".", 1)[0] != base:
            lines.append(f"{image.offset_data} {image.size} {target} {image.name}")
    return f"fulgor-tar-index 1 {len(data)} {len(lines)}\n" + "".join(line + "\n" for line in lines)


def header(name, size_field, kind=b"0", prefix=b""):
    """A raw ustar header: the size field as given (12 bytes), the checksum valid."""
    h = bytearray(512)
    h[0:len(name)] = name
    h[100:108] = b"0000644\0"
    h[124:136] = size_field
    h[136:148] = b"14712345670\0"
    h[156:157] = kind
    h[257:265] = b"ustar\x0000"
    h[345:345 + len(prefix)] = prefix
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def member(name, data, kind=b"0", size_field=None):
    size_field = size_field or b"%011o\0" % len(data)
    return header(name, size_field, kind) + data + b"\0" * (-len(data) % 512)


def end(blocks):
    return blocks + b"\0" * 1024


def tar_seeds(image_folder):
    png = open(os.path.join(image_folder, "valid_1x1.png"), "rb").read()
    jpeg = open(os.path.join(image_folder, "valid_1x1.jpg"), "rb").read()
    samples = [("train/0000", [("jpg", jpeg), ("cls", cls(0)), ("json", b'{"i": 0}')]),
               ("train/0001", [("png", png), ("cls", cls(2))]),
               ("train/0002", [("cls", cls(1)), ("jpeg", jpeg)])]
    long_key = "a" * 60 + "/" + "b" * 120
    valid = shard(samples)
    sample = member(b"s.png", png) + member(b"s.cls", cls(3))
    size = len(end(sample))
    one = end(sample)

    def indexed(*lines, count=None, shard_bytes=None):
        count = len(lines) if count is None else count
        shard_bytes = len(one) if shard_bytes is None else shard_bytes
        return one + f"fulgor-tar-index 1 {shard_bytes} {count}\n".encode() + b"".join(
            line.encode() + b"\n" for line in lines)

    big = b"%011o\0" % (len(png) + 100000)
    seeds = {
        "valid_pax.tar": valid,
        "valid_gnu.tar": shard(samples, tarfile.GNU_FORMAT),
        "valid_ustar.tar": shard(samples, tarfile.USTAR_FORMAT),
        "valid_pax_long_name.tar": shard([(long_key, [("png", png), ("cls", cls(5))])]),
        "valid_gnu_long_name.tar": shard([(long_key, [("png", png), ("cls", cls(5))])], tarfile.GNU_FORMAT),
        "valid_pax_with_index.tar": valid + index_of(valid).encode(),
        "valid_gnu_with_index.tar": shard(samples, tarfile.GNU_FORMAT) +
        index_of(shard(samples, tarfile.GNU_FORMAT)).encode(),
        "valid_raw_with_index.tar": indexed(f"512 {len(png)} 3 s.png"),
        # Declared sizes past the end, and size fields that are no octal number.
        "size_past_end.tar": end(member(b"s.png", png, size_field=big) + member(b"s.cls", cls(3))),
        "size_octal_all_sevens.tar": end(member(b"s.png", png, size_field=b"77777777777\0")),
        "size_octal_12_digits.tar": end(member(b"s.png", png, size_field=b"777777777777")),
        "size_negative_text.tar": end(member(b"s.png", png, size_field=b"-0000000001\0") + member(b"s.cls", cls(3))),
        "size_not_octal.tar": end(member(b"s.png", png, size_field=b"0000000009x\0") + member(b"s.cls", cls(3))),
        "size_spaces.tar": end(member(b"s.png", png, size_field=(b"  %o \0" % len(png)).ljust(12, b" ")) +
                               member(b"s.cls", cls(3))),
        "size_base256_negative.tar": end(member(b"s.png", png, size_field=b"\xff" * 12) + member(b"s.cls", cls(3))),
        "size_base256_huge.tar": end(member(b"s.png", png, size_field=b"\x80" + b"\xff" * 11)),
        "size_base256_wraps.tar": end(member(b"s.png", png, size_field=b"\x80\x01" + b"\0" * 8 +
                                             struct.pack(">H", len(png))) + member(b"s.cls", cls(3))),
        "size_base256_valid.tar": end(member(b"s.png", png, size_field=b"\x80" + b"\0" * 9 +
                                             struct.pack(">H", len(png))) + member(b"s.cls", cls(3))),
        "truncated_no_end_blocks.tar": sample,
        "truncated_in_member.tar": sample[:700],
        "truncated_in_header.tar": sample[:300],
        "empty_archive.tar": end(b""),
        "empty": b"",
        "not_ustar.tar": b"\0" * 257 + b"notar" + b"\0" * 250 + b"\0" * 1024,
        # Members that are no regular files, named as images.
        "symlink_named_png.tar": end(header(b"s.png", b"%011o\0" % 0, b"2") + member(b"s.cls", cls(3))),
        "hardlink_named_png.tar": end(header(b"s.png", b"%011o\0" % 0, b"1") + member(b"s.cls", cls(3))),
        "fifo_named_png.tar": end(header(b"s.png", b"%011o\0" % 0, b"6") + member(b"s.cls", cls(3))),
        "device_named_png.tar": end(header(b"s.png", b"%011o\0" % 0, b"3") + member(b"s.cls", cls(3))),
        "directory_named_png.tar": end(header(b"s.png/", b"%011o\0" % 0, b"5") + sample),
        # Names: nothing is extracted, so these are only keys.
        "names_dotdot.tar": end(member(b"../../etc/x.png", png) + member(b"../../etc/x.cls", cls(0))),
        "names_absolute.tar": end(member(b"/etc/x.png", png) + member(b"/etc/x.cls", cls(0))),
        "names_prefix_dotdot.tar": end(header(b"x.png", b"%011o\0" % len(png), prefix=b"../..") + png +
                                       b"\0" * (-len(png) % 512) + member(b"../../x.cls", cls(0))),
        "names_empty_key.tar": end(member(b".png", png) + member(b".cls", cls(1)) + member(b"t.cls", cls(2))),
        "names_empty_key_then_sample.tar": end(member(b".png", png) + member(b"t.cls", cls(2))),
        # Long names and pax records.
        "pax_length_huge.tar": end(member(b"p", b"18446744073709551615 path=x\n", b"x") + sample),
        "pax_length_zero.tar": end(member(b"p", b"0 path=x.png\n", b"x") + sample),
        "pax_length_past_record.tar": end(member(b"p", b"99 path=x.png\n", b"x") + sample),
        "pax_path_dotdot.tar": end(member(b"p", b"20 path=../../s.png\n", b"x") + sample),
        "pax_size_record.tar": end(member(b"p", b"16 size=999999\n", b"x") + sample),
        "gnu_long_name_huge.tar": end(header(b"././@LongLink", b"77777777777\0", b"L") + sample),
        "gnu_long_name_no_nul.tar": end(member(b"././@LongLink", b"x" * 600, b"L") + sample),
        # Samples without an image or a class, or with a class out of range.
        "sample_without_cls.tar": end(member(b"s.png", png)),
        "sample_without_image.tar": end(member(b"s.cls", cls(0))),
        "cls_huge.tar": end(member(b"s.png", png) + member(b"s.cls", b"999999999999\n")),
        "cls_23_digits.tar": end(member(b"s.png", png) + member(b"s.cls", b"12345678901234567890123")),
        "cls_negative.tar": end(member(b"s.png", png) + member(b"s.cls", b"-1\n")),
        "cls_size_huge.tar": end(member(b"s.png", png) + member(b"s.cls", b"", size_field=b"77777777777\0")),
        # Indexes (after the shard) that do not fit their shard.
        "index_offset_past_end.tar": indexed(f"{size} {len(png)} 3 s.png"),
        "index_size_past_end.tar": indexed(f"512 {size} 3 s.png"),
        "index_offset_plus_size_wraps.tar": indexed("512 18446744073709551615 3 s.png"),
        "index_offset_negative.tar": indexed(f"-1 {len(png)} 3 s.png"),
        "index_overlapping.tar": indexed(f"512 {len(png)} 3 s.png", f"500 {len(png)} 3 s.png",
                                         f"0 {size} 1 whole"),
        "index_count_huge.tar": indexed(f"512 {len(png)} 3 s.png", count=999999999999),
        "index_count_zero.tar": indexed(count=0),
        "index_class_huge.tar": indexed(f"512 {len(png)} 999999999999 s.png"),
        "index_class_negative.tar": indexed(f"512 {len(png)} -1 s.png"),
        "index_member_missing.tar": indexed(f"512 {len(png)} 3"),
        "index_stale.tar": indexed(f"512 {len(png)} 3 s.png", shard_bytes=size + 512),
        "index_version_2.tar": one + f"fulgor-tar-index 2 {size} 1\n512 {len(png)} 3 s.png\n".encode(),
        "index_magic_only.tar": one + b"fulgor-tar-index",
    }
    return seeds


def main(replay, corpus):
    images = os.path.join(corpus, "image")
    subprocess.run([replay, "--write-image-seeds", images], check=True)
    for folder, seeds in ((images, image_seeds(images)), (os.path.join(corpus, "tar_shard"), tar_seeds(images))):
        for name, data in seeds.items():
            with open(os.path.join(folder, name), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main(*sys.argv[1:])
