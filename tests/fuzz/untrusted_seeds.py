#!/usr/bin/env python3
"""Writes the seeds of files from elsewhere (docs/interop.md, "Files from
elsewhere") for the torch_file and checkpoint targets, small versions of what
tests/interop/untrusted_files_test.cpp reads:

    /usr/bin/python3 tests/fuzz/untrusted_seeds.py tests/fuzz/corpus/checkpoint/valid.ckpt tests/fuzz/corpus

Needs python3-torch (Debian's, at /usr/bin/python3).
"""

import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
import hostile_torch_files as hostile  # noqa: E402
import plant_archive  # noqa: E402


def main(valid_checkpoint, corpus):
    torch_file = os.path.join(corpus, "torch_file")
    seeds = {
        "untrusted_deep_tuple.pt": hostile.with_pickle(b"\x80\x02)" + b"\x85" * 2000 + b"."),
        "untrusted_deep_list_in_state_dict.pt": hostile.with_pickle(
            hostile.state_dict_pickle_with(b"]" * 2000 + b"a" * 1999)),
        "untrusted_tuple_keys.pt": hostile.saved({(1, 2): hostile.torch.ones(1)}),
        "untrusted_long_integers.pt": hostile.with_pickle(
            b"\x80\x02(" + (b"\x8b\xf9\x06\x00\x00" + b"\x01" * 1785) * 2 + b"\x8b\x00\x10\x00\x00" +
            b"\x01" * 4096 + b"l."),
        "untrusted_recursive_list.pt": hostile.with_pickle(b"\x80\x02]q\x00h\x00a."),
        "untrusted_memo_huge.pt": hostile.with_pickle(b"\x80\x02)r\xff\xff\xff\xff."),
        "untrusted_expanded_view.pt": hostile.saved({"w": hostile.torch.ones(1).expand(2 ** 62)}),
        "untrusted_overlapping_records.pt": hostile.overlapping(),
    }
    for name, data in seeds.items():
        with open(os.path.join(torch_file, name), "wb") as f:
            f.write(data)
    work = tempfile.mkdtemp()
    try:
        for kind, extra in (("setstate", "/tmp/fulgor_fuzz_setstate_ran"), ("deep_tuple", "2000"),
                            ("memo_huge", None), ("torchbind", None)):
            out = os.path.join(work, kind)
            plant_archive.main(valid_checkpoint, out, kind, extra)
            shutil.copyfile(out, os.path.join(corpus, "checkpoint", f"untrusted_{kind}"))
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main(*sys.argv[1:])
