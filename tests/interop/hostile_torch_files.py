#!/usr/bin/env python3
"""Writes torch.save files that ask a reader for too much, into OUT:

    hostile_torch_files.py OUT

deep_tuple.pt        a tuple nested 100000 deep
deep_list.pt         a valid state dict with a list nested a million deep beside its tensor
tuple_keys.pt        a dict keyed by tuples (torch.load(weights_only=True) loads it)
long_integers.pt     500 integers of 4 KB each (LONG4)
recursive_list.pt    a list that contains itself
memo_huge.pt         a memo index of 2^32-1
expanded.pt          a state dict whose tensor is a stride-0 view of 2^62 elements
overlapping.pt       a valid file whose central directory lists its data.pkl 200 times
"""

import io
import os
import struct
import sys
import zipfile

import torch


def saved(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def with_pickle(pickle):
    """A torch.save archive of {"w": tensor} whose data.pkl is replaced."""
    source = zipfile.ZipFile(io.BytesIO(saved({"w": torch.ones(2)})))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name in source.namelist():
            z.writestr(name, pickle if name.endswith("/data.pkl") else source.read(name))
    return buf.getvalue()


def state_dict_pickle_with(extra):
    """The pickle of {"w": <a tensor over storage 0>, "x": <what `extra` pushes>}."""
    w = (b"ctorch._utils\n_rebuild_tensor_v2\n(" +
         b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x02tQ" +
         b"K\x00K\x02\x85K\x01\x85\x89ccollections\nOrderedDict\n)RtR")
    return b"\x80\x02}(X\x01\x00\x00\x00w" + w + b"X\x01\x00\x00\x00x" + extra + b"u."


def overlapping():
    """A valid file whose central directory names its data.pkl's bytes 200
    more times, under other names."""
    valid = saved({"w": torch.ones(2)})
    end = valid.rindex(b"PK\x05\x06")
    size, offset = struct.unpack("<II", valid[end + 12:end + 20])
    central, at, entries = valid[offset:offset + size], 0, []
    while at < len(central):
        n, m, k = struct.unpack("<HHH", central[at + 28:at + 34])
        entries.append(central[at:at + 46 + n + m + k])
        at += 46 + n + m + k
    pkl = next(e for e in entries if b"/data.pkl" in e)
    copies = [pkl.replace(b"data.pkl", b"x%07d" % i) for i in range(200)]
    new_central = b"".join(entries + copies)
    count = len(entries) + len(copies)
    tail = valid[end:end + 8] + struct.pack("<HHII", count, count, len(new_central), offset) + valid[end + 20:]
    return valid[:offset] + new_central + tail


def main(out):
    os.makedirs(out, exist_ok=True)
    files = {
        "deep_tuple.pt": with_pickle(b"\x80\x02)" + b"\x85" * 100000 + b"."),
        "deep_list.pt": with_pickle(state_dict_pickle_with(b"]" * 1000000 + b"a" * 999999)),
        "tuple_keys.pt": saved({(1, 2): torch.ones(1)}),
        "long_integers.pt": with_pickle(b"\x80\x02(" + (b"\x8b\x00\x10\x00\x00" + b"\x01" * 4096) * 500 + b"l."),
        "recursive_list.pt": with_pickle(b"\x80\x02]q\x00h\x00a."),
        "memo_huge.pt": with_pickle(b"\x80\x02)r\xff\xff\xff\xff."),
        "expanded.pt": saved({"w": torch.ones(1).expand(2 ** 62)}),
        "overlapping.pt": overlapping(),
    }
    for name, data in files.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main(*sys.argv[1:])
