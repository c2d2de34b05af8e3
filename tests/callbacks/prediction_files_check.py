"""Reads a prediction writer's .pt files with torch.load(weights_only=True)
and compares them with what the C++ test predicted.

Usage: /usr/bin/python3 prediction_files_check.py EXPECTED.json DIR
EXPECTED.json maps each file's path under DIR to {"kind": ..., "value": ...}:
"tensor" (a tensor, value its tolist()), "tensors" (a list of tensors),
"ints" (a list of ints) or "int_lists" (a list of lists of ints). Every file
must load and equal its value exactly; no other .pt file may be in DIR.
Exits 1, saying what differs, otherwise."""
import json
import os
import sys

import torch


def check(kind, loaded, value):
    if kind == "tensor":
        return isinstance(loaded, torch.Tensor) and loaded.tolist() == value
    if kind == "tensors":
        return (isinstance(loaded, list) and len(loaded) == len(value)
                and all(check("tensor", t, v) for t, v in zip(loaded, value)))
    if kind == "ints":
        return isinstance(loaded, list) and all(isinstance(i, int) for i in loaded) and loaded == value
    if kind == "int_lists":
        return (isinstance(loaded, list) and len(loaded) == len(value)
                and all(check("ints", t, v) for t, v in zip(loaded, value)))
    raise ValueError(kind)


def main():
    expected = json.load(open(sys.argv[1]))
    folder = sys.argv[2]
    failures = []
    present = sorted(os.path.relpath(os.path.join(d, f), folder)
                     for d, _, files in os.walk(folder) for f in files if f.endswith(".pt"))
    if present != sorted(expected):
        failures.append(f"files {present}, expected {sorted(expected)}")
    for name, entry in expected.items():
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            continue
        loaded = torch.load(path, weights_only=True)
        if not check(entry["kind"], loaded, entry["value"]):
            failures.append(f"{name}: {loaded!r} is not the {entry['kind']} {entry['value']!r}")
    print(f"torch {torch.__version__}: {len(expected)} files checked")
    for f in failures:
        print(f)
    sys.exit(1 if failures else 0)


main()
