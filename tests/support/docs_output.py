"""Checks that the sample output a doc shows is what the program prints now.

    docs_output.py MARKDOWN MARKER [--loose NAME:WORDS]... -- COMMAND [ARGS...]

The sample is the ``` block right after the line MARKER in MARKDOWN. The
"LibTorch X.Y.Z" in it stands for the LibTorch the program runs on. A line
that starts with a --loose NAME says what depends on the machine and the
LibTorch version beyond its first WORDS words (fulgor-info's reasons, the
BLAS it found), so only those are compared.
"""
import re
import subprocess
import sys

from markdown_blocks import marked


def sample(markdown, marker):
    code = marked(markdown, marker).code.rstrip("\n")
    return [line for line in code.split("\n") if not line.startswith("$ ")]


def main():
    split = sys.argv.index("--")
    markdown, marker, options = sys.argv[1], sys.argv[2], sys.argv[3:split]
    loose = dict(options[i + 1].rsplit(":", 1) for i, o in enumerate(options) if o == "--loose")
    run = subprocess.run(sys.argv[split + 1:], capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"the program exited with {run.returncode}:\n{run.stdout}{run.stderr}")
    actual = run.stdout.rstrip("\n").split("\n")
    torch = re.search(r"LibTorch (\d+\.\d+\.\d+)", run.stdout)
    expected = [re.sub(r"LibTorch \d+\.\d+\.\d+", f"LibTorch {torch.group(1)}", line) if torch else line
                for line in sample(markdown, marker)]
    problems = []
    if len(actual) != len(expected):
        problems.append(f"{len(expected)} lines in the docs, {len(actual)} printed")
    for want, got in zip(expected, actual):
        if want.split()[:1] and want.split()[0] in loose:
            words = int(loose[want.split()[0]])
            want, got = want.split()[:words], got.split()[:words]
        if want != got:
            problems.append(f"the docs show\n  {want}\nbut the program prints\n  {got}")
    if problems:
        sys.exit(f"{markdown}'s sample after '{marker}' is stale:\n" + "\n".join(problems) +
                 "\n\nThe program prints:\n" + run.stdout)
    print(f"{markdown}: the sample after '{marker}' matches")


main()
