"""Checks the include graph of src/ and include/fulgor/ against the layers
docs/architecture.md lists: no include from a folder to one on a higher
layer, no two folders that include each other, every folder on a layer, every
private header included by its path under src/ (not by its name alone, from
beside it), and at most 8 files in the src/ root.

usage: layers.py PROJECT_ROOT
"""

import collections
import pathlib
import re
import sys

MAX_ROOT_FILES = 8


def read_layers(doc):
    """The layer of each folder (and of the files a layer names), from the
    numbered list under "## Layers"."""
    section = doc.split("## Layers", 1)[1].split("\n## ", 1)[0]
    layers = {}
    for number, text in re.findall(r"^(\d+)\. (.*(?:\n {3}.*)*)", section, re.M):
        if "the root" in text:
            layers["root"] = int(number)
        for name in re.findall(r"`([^`]+)`", text):
            if name.endswith("/"):
                layers[name[:-1]] = int(number)
            elif "/" in name and name.endswith(".h"):
                layers[name] = int(number)
    return layers


def place(relative, folders, layers):
    """The folder (or layered file) a path under src/ or include/fulgor/
    belongs to; a root header named after a folder (trainer.h, data.h) is
    that folder's."""
    if relative in layers:
        return relative
    parts = relative.split("/")
    if len(parts) > 1:
        return parts[0]
    stem = parts[0].rsplit(".", 1)[0]
    return stem if stem in folders else "root"


def main(root):
    root = pathlib.Path(root)
    layers = read_layers((root / "docs" / "architecture.md").read_text())
    bases = [root / "src", root / "include" / "fulgor"]
    folders = {p.name for base in bases for p in base.iterdir() if p.is_dir()}
    problems = []
    for folder in sorted(folders - set(layers)):
        problems.append(f"folder {folder}/ is on no layer of docs/architecture.md")

    includes = collections.Counter()
    upward = []
    short = []  # private headers included by their name alone, not their path under src/
    for base in bases:
        for path in sorted(base.rglob("*")):
            if path.suffix not in (".h", ".cpp", ".def") or path.name == "fulgor.h" and path.parent == bases[1]:
                continue
            text = path.read_text()
            source = place(str(path.relative_to(base)), folders, layers)
            for written in re.findall(r'^\s*#include\s+"([^"]+)"', text, re.M):
                target = written
                if target.startswith("fulgor/"):
                    target = target[len("fulgor/"):]
                elif not (root / "src" / target).exists():
                    if (path.parent / written).exists():
                        short.append(f'{path.relative_to(root)} includes "{written}", which docs/architecture.md '
                                     f'writes "{(path.parent / written).relative_to(root / "src")}"')
                    continue
                if target == "fulgor.h":
                    continue
                destination = place(target, folders, layers)
                if destination == source:
                    continue
                includes[(source, destination)] += 1
                if layers.get(destination, 0) > layers.get(source, 0):
                    upward.append(f"{path.relative_to(root)} includes {written}")

    mutual = sorted((a, b) for (a, b) in includes if a < b and (b, a) in includes)
    for a, b in mutual:
        problems.append(f"{a}/ and {b}/ include each other ({includes[(a, b)]} and {includes[(b, a)]} includes)")
    for line in upward:
        problems.append(f"{line}, which is on a higher layer")
    problems.extend(short)
    root_files = sorted(p.name for p in (root / "src").iterdir() if p.is_file())
    if len(root_files) > MAX_ROOT_FILES:
        problems.append(f"src/ holds {len(root_files)} files ({', '.join(root_files)}): at most {MAX_ROOT_FILES}")

    print(f"{len(folders)} folders on {len(set(layers.values()))} layers, {sum(includes.values())} includes between "
          f"folders, {len(upward)} upward, {len(mutual)} mutual pairs, {len(short)} short private includes, "
          f"{len(root_files)} files in src/")
    for problem in problems:
        print("error:", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
