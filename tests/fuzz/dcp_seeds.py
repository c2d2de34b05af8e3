#!/usr/bin/env python3
"""Writes the seeds of the dcp_metadata target: the .metadata of folders that
torch.distributed.checkpoint saves (one process; a state as Python's
optimizer keeps it), and hostile versions of it, each refused by fulgor for
its own reason (docs/interop.md, "Distributed checkpoints"):

    python3 tests/fuzz/dcp_seeds.py tests/fuzz/corpus/dcp_metadata

Needs torch 2.x (Debian 13's python3-torch), whose metadata classes these are.
"""

import copy
import io
import os
import pickle
import sys
import tempfile
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex


def saved_metadata():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.LayerNorm(2))
    optim = torch.optim.Adam(net.parameters())
    net(torch.randn(4, 3)).sum().backward()
    optim.step()
    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": net.state_dict(), "optim": optim.state_dict(), "epoch": 2}, checkpoint_id=folder)
        with open(os.path.join(folder, ".metadata"), "rb") as f:
            return pickle.load(f)


def storage_of(metadata, fqn):
    return next(key for key in metadata.storage_data if key.fqn == fqn)


def main(corpus):
    os.makedirs(corpus, exist_ok=True)
    valid = saved_metadata()
    seeds = {"pytorch_one_process": valid}

    outside = copy.deepcopy(valid)
    key = storage_of(outside, "model.0.weight")
    outside.storage_data[key].relative_path = "../../etc/passwd"
    seeds["hostile_path_outside"] = outside

    overlap = copy.deepcopy(valid)
    chunks = overlap.state_dict_metadata["model.0.weight"].chunks
    chunks.append(ChunkStorageMetadata(offsets=torch.Size([1, 0]), sizes=torch.Size([1, 3])))
    seeds["hostile_overlapping_chunks"] = overlap

    outside_tensor = copy.deepcopy(valid)
    outside_tensor.state_dict_metadata["model.0.bias"].chunks[0].sizes = torch.Size([3])
    seeds["hostile_chunk_outside_tensor"] = outside_tensor

    unstored = copy.deepcopy(valid)
    del unstored.storage_data[storage_of(unstored, "model.1.weight")]
    seeds["hostile_chunk_not_stored"] = unstored

    huge = copy.deepcopy(valid)
    huge.storage_data[storage_of(huge, "epoch")].offset = 2**63 - 1
    seeds["hostile_offset_wraps"] = huge

    for name, metadata in seeds.items():
        with open(os.path.join(corpus, name), "wb") as f:
            pickle.dump(metadata, f)

    class Runs:  # what a pickle from elsewhere may try: a call of os.system
        def __reduce__(self):
            return (os.system, ("true",))

    with open(os.path.join(corpus, "hostile_os_system"), "wb") as f:
        f.write(pickle.dumps(Runs(), protocol=2))
    deep = b"\x80\x02" + b"}(" * 1500 + b"\x8c\x01k}" + b"u" * 1500 + b"."
    with open(os.path.join(corpus, "hostile_deep_dicts"), "wb") as f:
        f.write(deep)


if __name__ == "__main__":
    main(sys.argv[1])
