"""The fenced code blocks of a Markdown file, with the markers before them.

A marker is an HTML comment on a line of its own (`<!-- fragment -->`,
`<!-- tested: NAME -->`, `<!-- output: NAME -->`); the markers of a block are
those on the lines right above its opening fence.
"""
import re
from dataclasses import dataclass, field


@dataclass
class Block:
    path: str
    line: int  # of the opening fence
    lang: str
    code: str
    markers: list = field(default_factory=list)


def blocks(path):
    lines = open(path, encoding="utf-8").read().split("\n")
    found, i = [], 0
    while i < len(lines):
        opening = re.match(r"```(\w*)$", lines[i])
        if not opening:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j] == "```"), None)
        if end is None:
            raise SystemExit(f"{path}:{i + 1}: the ``` block does not end")
        markers, above = [], i - 1
        while above >= 0 and re.fullmatch(r"<!--.*-->", lines[above].strip()):
            markers.insert(0, lines[above].strip())
            above -= 1
        found.append(Block(path, i + 1, opening.group(1), "\n".join(lines[i + 1:end]) + "\n", markers))
        i = end + 1
    return found


def marked(path, marker):
    """The first block after the line `marker`."""
    for block in blocks(path):
        if marker in block.markers:
            return block
    raise SystemExit(f"{path} has no ``` block right after a line '{marker}'")
