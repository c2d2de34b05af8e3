"""Reference files for fulgor's torch.save reader and writer, made by PyTorch.

  torch_files.py write DIR        writes DIR/*.pt and DIR/expected.json, which
                                  says what each tensor holds, as PyTorch sees it
  torch_files.py check FILE JSON KEY
                                  loads FILE (written by fulgor) with
                                  torch.load(weights_only=True) and checks it
                                  against what JSON has under KEY
  torch_files.py safetensors FILE JSON
                                  reads FILE (written by fulgor) by the
                                  format's specification and checks it
                                  against JSON's "safetensors"
  torch_files.py network FILE OUT loads FILE into network() and writes its
                                  outputs on a fixed input to OUT

Run with Debian's python3, which has python3-torch.
"""

import collections
import io
import json
import os
import pickle
import sys
import zipfile

import torch

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
NAMES = {v: k for k, v in DTYPES.items()}


def storage_ptr(t):
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage().data_ptr()
    return t.storage().data_ptr()


def describe(tensors):
    """What fulgor must find: dtype, shape, stride, offset, the values' bytes
    in row-major order, and which tensors share a storage."""
    groups = {}
    out = {}
    for name, t in tensors.items():
        raw = t.detach().reshape(-1).contiguous()
        raw = raw.view(torch.uint8) if raw.numel() else torch.empty(0, dtype=torch.uint8)
        out[name] = {
            "dtype": NAMES[t.dtype],
            "shape": list(t.shape),
            "stride": list(t.stride()),
            "offset": t.storage_offset(),
            "hex": bytes(raw.tolist()).hex(),
            "storage": groups.setdefault(storage_ptr(t), len(groups)),
            "requires_grad": t.requires_grad,
        }
    return out


def values(dtype, n, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype.is_floating_point:
        return (torch.randn(n, generator=g, dtype=torch.float64) * 100).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, (n,), generator=g, dtype=torch.int64).to(dtype)


def state_dict():
    sd = collections.OrderedDict()
    for i, (name, dtype) in enumerate(DTYPES.items()):
        sd[name] = values(dtype, 24, i).reshape(2, 3, 4)
    base = values(torch.float32, 40, 99).reshape(5, 8)
    sd["base"] = base
    sd["transposed"] = base.t()                 # shares base's storage
    sd["sliced"] = base[1:4, 2:7:2]             # an offset and strides
    sd["row"] = base[3]
    sd["scalar"] = torch.tensor(2.5, dtype=torch.float64)
    sd["empty"] = torch.empty(0, 3, dtype=torch.int32)
    sd["param"] = torch.nn.Parameter(values(torch.float32, 6, 7))
    return sd


class Evil:
    def __init__(self, function, argument):
        self.function, self.argument = function, argument

    def __reduce__(self):
        return (self.function, (self.argument,))


class Pickler(pickle.Pickler):
    """torch.save's pickling with a chosen storage location, for storages
    saved on devices this machine lacks."""

    def __init__(self, file, location):
        super().__init__(file, protocol=2)
        self.location, self.storages = location, {}

    def persistent_id(self, obj):
        if isinstance(obj, getattr(torch.storage, "TypedStorage", ())) or torch.is_storage(obj):
            key = str(len(self.storages))
            data = obj.cpu()
            self.storages[key] = data
            storage_type = getattr(obj, "_pickle_storage_type", None) or obj.pickle_storage_type
            numel = obj._size() if hasattr(obj, "_size") else obj.size()
            return ("storage", getattr(torch, storage_type()), key, self.location, numel)
        return None


def save_on(path, obj, location):
    buffer = io.BytesIO()
    pickler = Pickler(buffer, location)
    pickler.dump(obj)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", buffer.getvalue())
        for key, storage in pickler.storages.items():
            t = torch.tensor([], dtype=storage.dtype).set_(storage)
            raw = t.view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
            z.writestr("archive/data/" + key, bytes(raw.tolist()))
        z.writestr("archive/version", "3\n")


def network():
    """The network the C++ tests build too: torch::nn::Sequential names its
    children 0, 1, 2, 3 as Python's does."""
    torch.manual_seed(5)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    net.train()
    net(torch.randn(16, 4))  # running statistics and the batch count move
    return net.eval()


def lightning_checkpoint(state_dict, prefix):
    """What Lightning's Trainer.save_checkpoint writes (its dump_checkpoint):
    the LightningModule's state dict, whose keys carry the attribute that
    holds the network."""
    return {
        "epoch": 2,
        "global_step": 40,
        "pytorch-lightning_version": "2.4.0",
        "state_dict": collections.OrderedDict((prefix + k, v) for k, v in state_dict.items()),
        "loops": {"fit_loop": {"state_dict": {}}},
        "callbacks": {},
        "optimizer_states": [],
        "lr_schedulers": [],
        "hparams_name": "kwargs",
        "hyper_parameters": {"hidden": 8, "lr": 0.01},
    }


def resume_checkpoint():
    """A Lightning run for docs/interop.md's Regressor to continue: the
    LightningModule held the network as `self.net`, its SGD with momentum has
    stepped, and two epochs of four batches (8 steps) are done."""
    net = network().train()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    torch.nn.functional.mse_loss(net(torch.randn(16, 4)), torch.randn(16, 2)).backward()
    optimizer.step()
    ckpt = lightning_checkpoint(net.state_dict(), "net.")
    counts = {"ready": 2, "started": 2, "processed": 2, "completed": 2}
    ckpt.update({"epoch": 2, "global_step": 8, "optimizer_states": [optimizer.state_dict()],
                 "loops": {"fit_loop": {"epoch_progress": {"total": counts, "current": counts}}}})
    return ckpt


def write_networks(directory, expected):
    net = network()
    sd = net.state_dict()
    torch.save(sd, os.path.join(directory, "net.pt"))
    torch.save({"model": sd, "optimizer": {"state": {}, "param_groups": []}}, os.path.join(directory, "net_model.pt"))
    torch.save(lightning_checkpoint(sd, "model."), os.path.join(directory, "net.ckpt"))
    resume = resume_checkpoint()
    torch.save(resume, os.path.join(directory, "net_resume.ckpt"))
    x = torch.randn(5, 4)
    with torch.no_grad():
        y = net(x)
    expected["network"] = {"state_dict": describe(sd), "input": x.reshape(-1).tolist(), "output": y.reshape(-1).tolist(),
                           "resume_state_dict": describe(resume["state_dict"])}


SAFETENSORS_DTYPES = {"float32": "F32", "float64": "F64", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
                      "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}


def raw_bytes(t):
    t = t.detach().reshape(-1).contiguous()
    return bytes((t.view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)).tolist())


def write_safetensors(path, tensors, metadata):
    """The format by its specification, as python3-safetensors would write it
    (Debian has no such package): an 8-byte little-endian header length, the
    JSON header, the tensors' bytes back to back."""
    header, data = {"__metadata__": metadata}, b""
    for name, t in tensors.items():
        raw = raw_bytes(t)
        header[name] = {"dtype": SAFETENSORS_DTYPES[NAMES[t.dtype]], "shape": list(t.shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + data)


def check_safetensors(path, expected_path):
    """Reads fulgor's .safetensors by the specification and compares each
    tensor's dtype, shape and bytes with expected.json's "safetensors"."""
    with open(expected_path) as f:
        expected = json.load(f)
    with open(path, "rb") as f:
        raw = f.read()
    length = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + length])
    data = raw[8 + length:]
    if header.pop("__metadata__", None) != expected["safetensors_metadata"]:
        sys.exit("__metadata__ differs")
    ends = sorted((info["data_offsets"][0], info["data_offsets"][1]) for info in header.values())
    if [b for b, _ in ends] != [0] + [e for _, e in ends[:-1]] or ends[-1][1] != len(data):
        sys.exit(f"offsets not contiguous: {ends}")
    want = expected["safetensors"]
    if sorted(header) != sorted(want):
        sys.exit(f"names differ: {sorted(header)} vs {sorted(want)}")
    for name, info in header.items():
        begin, end = info["data_offsets"]
        if info["dtype"] != SAFETENSORS_DTYPES[want[name]["dtype"]] or info["shape"] != want[name]["shape"] \
                or data[begin:end].hex() != want[name]["hex"]:
            sys.exit(f"{name}: {info} differs from {want[name]}")
    print(f"{len(header)} tensors as written")


def record_spans(path):
    """Where each record's data lies in a zip file: [start, size]."""
    with open(path, "rb") as f:
        raw = f.read()
    spans = []
    for info in zipfile.ZipFile(path).infolist():
        at = info.header_offset
        name_length = int.from_bytes(raw[at + 26:at + 28], "little")
        extra_length = int.from_bytes(raw[at + 28:at + 30], "little")
        spans.append([at + 30 + name_length + extra_length, info.file_size])
    return spans


def write(directory):
    os.makedirs(directory, exist_ok=True)
    sd = state_dict()
    torch.save(sd, os.path.join(directory, "state_dict.pt"))
    expected = {"torch": torch.__version__, "state_dict": describe(sd),
                "state_dict_records": record_spans(os.path.join(directory, "state_dict.pt"))}
    extras = {"epoch": 3, "lr": 0.125, "name": "net", "flags": [True, False, None],
              "pair": (1, -2**40), "big": 2**70, "neg_big": -2**70, "blob": b"\x00\xffxy",
              "shape": torch.Size([2, 3]), "dtype": torch.bfloat16, "members": {5}}
    torch.save({"state_dict": sd, **extras}, os.path.join(directory, "container.pt"))
    expected["extras"] = {"big": str(2**70), "neg_big": str(-2**70), "blob": b"\x00\xffxy".hex(),
                          "dtype_bfloat16": int(torch.ones(1, dtype=torch.bfloat16).element_size())}
    small = collections.OrderedDict(w=values(torch.float32, 6, 1).reshape(2, 3), b=values(torch.int64, 3, 2))
    expected["devices"] = {}
    for location in ["cuda:1", "npu:0", "privateuseone", "mps", "xpu"]:
        save_on(os.path.join(directory, f"on_{location.replace(':', '_')}.pt"), small, location)
    expected["devices"] = describe(small)
    for label, function, argument in [("os_system", os.system, "touch " + os.path.join(directory, "pwned")),
                                      ("builtins_eval", eval, "open('" + os.path.join(directory, "pwned") + "','w')")]:
        torch.save({"weight": torch.ones(2), "payload": Evil(function, argument)},
                   os.path.join(directory, label + ".pt"))
        expected[label] = f"{function.__module__}.{function.__name__}"
    write_networks(directory, expected)
    plain = collections.OrderedDict((k, v.detach().contiguous()) for k, v in sd.items() if k not in ("transposed", "sliced", "row"))
    write_safetensors(os.path.join(directory, "tensors.safetensors"), plain, {"format": "pt", "source": "torch_files.py"})
    expected["safetensors"] = describe(plain)
    expected["safetensors_metadata"] = {"format": "pt", "source": "torch_files.py"}
    with open(os.path.join(directory, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)


def check(path, expected_path, key):
    """Loads what fulgor wrote with weights_only=True and compares it with
    what PyTorch described under `key` of expected.json: dtypes, shapes,
    strides, offsets, bytes and shared storages."""
    with open(expected_path) as f:
        want = json.load(f)[key]
    loaded = torch.load(path, weights_only=True)
    if not isinstance(loaded, collections.OrderedDict):
        sys.exit(f"{path} holds a {type(loaded).__name__}, not the OrderedDict of a state dict")
    got = describe(loaded)
    if list(got) != list(want):
        sys.exit(f"keys differ: {list(got)} vs {list(want)}")
    for name in want:
        for field in ["dtype", "shape", "stride", "offset", "hex", "storage"]:
            if got[name][field] != want[name][field]:
                sys.exit(f"{name}: {field} is {got[name][field]}, PyTorch wrote {want[name][field]}")
    print(f"torch {torch.__version__} read {len(got)} tensors from {path} with weights_only=True")


def run_network(path, out_path):
    """Loads fulgor's weights into network() and writes its outputs."""
    net = network()
    net.load_state_dict(torch.load(path, weights_only=True))
    torch.manual_seed(11)
    x = torch.randn(5, 4)
    with torch.no_grad():
        y = net.eval()(x)
    with open(out_path, "w") as f:
        json.dump({"input": x.reshape(-1).tolist(), "output": y.reshape(-1).tolist()}, f)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "write":
        write(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) == 4 and sys.argv[1] == "safetensors":
        check_safetensors(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "network":
        run_network(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
