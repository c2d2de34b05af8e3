"""fulgor-shard's shards, read back by Python's tarfile against the folder as
torchvision's ImageFolder orders it; fulgor-data-bench on both.

Usage: fulgor_shard_test.py FULGOR_SHARD FULGOR_DATA_BENCH
"""

import json
import os
import struct
import subprocess
import sys
import tarfile
import tempfile
import zlib


def png(width, height, seed):
    """A valid RGB PNG of a gradient, written with zlib alone."""
    rows = b"".join(
        b"\0" + bytes((x * 5 + y * 3 + seed * 40 + c * 60) % 256 for x in range(width) for c in range(3))
        for y in range(height))

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def torchvision_order(root):
    """torchvision's find_classes and make_dataset, for its default extensions."""
    extensions = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    samples = []
    for index, name in enumerate(classes):
        for folder, _, files in sorted(os.walk(os.path.join(root, name), followlinks=True)):
            for file in sorted(files):
                if file.lower().endswith(extensions):
                    samples.append((os.path.join(folder, file), index))
    return samples


def main():
    shard_tool, bench_tool = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as work:
        root = os.path.join(work, "images")
        for i in range(21):
            folder = os.path.join(root, f"class{i % 3}", "sub" if i % 5 == 0 else "")
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"{i:03d}.png"), "wb") as f:
                f.write(png(48, 40, i))
        with open(os.path.join(root, "class0", "notes.txt"), "w") as f:
            f.write("not an image")
        out = os.path.join(work, "shards")
        run = subprocess.run([shard_tool, root, out, "--shard-size", "0.02", "--prefix", "train"],
                             capture_output=True, text=True, check=True)
        shards = sorted(name for name in os.listdir(out) if name.endswith(".tar"))
        assert len(shards) > 1, f"expected several shards of 20 KB, got {shards}"
        samples = []
        for shard in shards:
            with tarfile.open(os.path.join(out, shard)) as tar:
                members = tar.getmembers()
                assert len(members) % 2 == 0, [m.name for m in members]
                for image, cls in zip(members[::2], members[1::2]):
                    key = image.name.split(".")[0]
                    assert cls.name == key + ".cls", (image.name, cls.name)
                    samples.append((tar.extractfile(image).read(), int(tar.extractfile(cls).read())))
                # The index beside it: each image's data offset and size as tarfile finds them.
                with open(os.path.join(out, shard + ".idx")) as f:
                    lines = f.read().splitlines()
                size = os.path.getsize(os.path.join(out, shard))
                assert lines[0] == f"fulgor-tar-index 1 {size} {len(members) // 2}", lines[0]
                expected = [f"{m.offset_data} {m.size} {int(tar.extractfile(c).read())} {m.name}"
                            for m, c in zip(members[::2], members[1::2])]
                assert lines[1:] == expected, (lines[1:3], expected[:2])
        expected = [(open(path, "rb").read(), target) for path, target in torchvision_order(root)]
        assert samples == expected, f"{len(samples)} samples in shards, {len(expected)} in the folder"
        pattern = run.stdout.strip().split(": ")[-1]
        plain = os.path.join(work, "plain")
        subprocess.run([shard_tool, root, plain, "--shard-size", "0.02", "--no-index"], check=True,
                       capture_output=True)
        assert not [name for name in os.listdir(plain) if name.endswith(".idx")], os.listdir(plain)
        for path in (root, pattern, os.path.join(plain, "shard-{000000..%06d}.tar" % (len(shards) - 1))):
            bench = subprocess.run([bench_tool, path, "--batch-size", "4", "--workers", "2", "--crop", "16"],
                                   capture_output=True, text=True, check=True)
            result = json.loads(bench.stdout.strip().splitlines()[-1])
            assert result["images"] == 21 and result["images_per_second"] > 0, result
    print("fulgor-shard wrote what tarfile reads, and its index; fulgor-data-bench read the folder and the shards")


if __name__ == "__main__":
    main()
