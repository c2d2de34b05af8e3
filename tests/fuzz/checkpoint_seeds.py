#!/usr/bin/env python3
"""Writes the seeds of the checkpoint fuzz target:

    python3 tests/fuzz/checkpoint_seeds.py build/tests/fuzz/fulgor_fuzz_replay tests/fuzz/corpus/checkpoint

valid.ckpt is the checkpoint fulgor writes for the target's one-parameter
module (fulgor_fuzz_replay --write-checkpoint-seed). The other files are that
checkpoint broken in the ways the reader must name (truncated, corrupted,
another version, the previous versions, a checksum that holds over something that is no archive),
and its metadata as JSON, which the target puts into an otherwise valid
checkpoint, as written and with the damage the Trainer must refuse.
"""

import copy
import io
import json
import os
import re
import struct
import subprocess
import sys
import zipfile


CHUNK = 262144


def xxh3(data):
    """The hash of Note [Checkpoint files] (include/fulgor/checkpoint/checkpoint.h), by
    xxhsum (Debian package xxhash)."""
    out = subprocess.run(["xxhsum", "-H3", "--little-endian", "-"], input=data, check=True,
                         capture_output=True).stdout.decode()
    # "XXH3_LE (-) = HEX" (xxhash 0.8.1) or "XXH3_HEX  -" (0.8.3)
    return int.from_bytes(bytes.fromhex(re.search(r"[0-9a-f]{16}", out.split("=")[-1]).group(0)), "little")


def fnv(data):
    """The checksum of version-2 files, which are still read."""
    h = 1469598103934665603
    data += b"\0" * (-len(data) % 8)
    for i in range(0, len(data), 8):
        h ^= struct.unpack("<Q", data[i:i + 8])[0]
        h = (h * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def container(archive, version=4, length=None):
    """A whole file: version 4 lists its chunks' hashes after the archive and
    hashes the list; versions 2 and 3 hash the whole archive."""
    length = len(archive) if length is None else length
    if version == 4:
        table = b"".join(struct.pack("<Q", xxh3(archive[at:at + CHUNK])) for at in range(0, len(archive), CHUNK))
        return b"FULGORCK" + struct.pack("<IQQ", version, length, xxh3(table)) + archive + table
    checksum = fnv(archive) if version == 2 else xxh3(archive)
    return b"FULGORCK" + struct.pack("<IQQ", version, length, checksum) + archive


def metadata_of(archive):
    """The "meta" string, pickled in the archive's data.pkl after its length."""
    with zipfile.ZipFile(io.BytesIO(archive)) as z:
        pickle = z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
    start = pickle.index(b'{"')
    (length,) = struct.unpack("<I", pickle[start - 4:start])
    return json.loads(pickle[start:start + length])


def main(replay, out):
    valid_path = os.path.join(out, "valid.ckpt")
    subprocess.run([replay, "--write-checkpoint-seed", valid_path], check=True)
    with open(valid_path, "rb") as f:
        valid = f.read()
    (length,) = struct.unpack("<Q", valid[12:20])
    archive = valid[28:28 + length]
    assert container(archive) == valid, "the file is not as Note [Checkpoint files] says"

    def write(name, data):
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)

    corrupted = bytearray(valid)
    corrupted[len(valid) // 2] ^= 0x5A
    write("truncated_in_header", valid[:20])
    write("truncated_half", valid[:len(valid) // 2])
    write("corrupted_byte", bytes(corrupted))
    write("trailing_bytes", valid + b"\0\0\0")
    write("version_2", container(archive, version=2))
    write("version_3", container(archive, version=3))
    write("version_5", b"FULGORCK" + struct.pack("<I", 5) + valid[12:])
    write("length_huge", container(archive, length=2**64 - 1))
    write("empty_archive_valid_checksum", container(b""))
    write("not_a_zip_valid_checksum", container(b"hello, not a zip"))

    meta = metadata_of(archive)
    callbacks = meta["callbacks"]

    def with_metadata(name, change=None):
        changed = copy.deepcopy(meta)
        if change:
            change(changed)
        write(name, json.dumps(changed, indent=1).encode())

    with_metadata("meta_valid.json")
    with_metadata("meta_negative_epoch.json", lambda m: m["loop"].update(epoch=-1000000000000))
    with_metadata("meta_negative_global_step.json", lambda m: m["loop"].update(global_step=-5))
    with_metadata("meta_huge_batches_in_epoch.json", lambda m: m["loop"].update(batches_in_epoch=10**18))
    with_metadata("meta_huge_global_step.json", lambda m: m["loop"].update(global_step=2**63 - 1))
    with_metadata("meta_negative_total_batches.json", lambda m: m["loop"].update(total_train_batches=-1))
    with_metadata("meta_loop_missing.json", lambda m: m.pop("loop"))
    with_metadata("meta_loop_wrong_types.json", lambda m: m["loop"].update(epoch="one", epoch_finished=1))
    with_metadata("meta_optimizers_negative.json", lambda m: m.update(optimizers=-1))
    with_metadata("meta_schedulers_not_array.json", lambda m: m.update(schedulers={"a": 1}))
    with_metadata("meta_scheduler_state_wrong.json", lambda m: m["schedulers"][0].update(last_epoch="x"))
    with_metadata("meta_scheduler_last_epoch_huge.json", lambda m: m["schedulers"][0].update(last_epoch=2**63 - 1))
    with_metadata("meta_callbacks_not_object.json", lambda m: m.update(callbacks=[1, 2]))
    with_metadata("meta_callback_states_empty.json",
                  lambda m: m.update(callbacks={key: {} for key in callbacks}))
    with_metadata("meta_early_stopping_wrong.json",
                  lambda m: callback_in(m, "EarlyStopping").update(best_score="low", patience=None))
    with_metadata("meta_early_stopping_reason_unknown.json",
                  lambda m: callback_in(m, "EarlyStopping").update(stopping_reason=99))
    with_metadata("meta_timer_wrong.json", lambda m: callback_in(m, "fulgor::Timer").update(time_elapsed="long"))
    with_metadata("meta_model_checkpoint_wrong.json",
                  lambda m: callback_in(m, "ModelCheckpoint").update(best_k_models=[1], best_model_path=3))
    with_metadata("meta_module_missing.json", lambda m: m.pop("module"))
    with_metadata("meta_format_version_2.json", lambda m: m.update(format_version=2))
    with_metadata("meta_format_not_string.json", lambda m: m.update(format=1))
    with_metadata("meta_accelerator_not_string.json", lambda m: m.update(accelerator=5))
    write("meta_not_object.json", b"[1, 2, 3]")
    write("meta_empty_object.json", b"{}")


def callback_in(meta, prefix):
    return next(state for key, state in meta["callbacks"].items() if key.startswith(prefix))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
