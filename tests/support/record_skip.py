"""Runs a test's command that exits with 77 when it skips; then keeps the lines
it printed that start with "SKIP" as the test's reason, where the summary at
the end of the ctest run reads them (Note [Skip reasons on the terminal] in
tests/CMakeLists.txt).

    record_skip.py FOLDER NAME -- COMMAND [ARGS...]
"""
import subprocess
import sys
from pathlib import Path

SKIPPED = 77


def main():
    split = sys.argv.index("--")
    folder, name = Path(sys.argv[1]), sys.argv[2]
    done = subprocess.run(sys.argv[split + 1:], capture_output=True, text=True)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    if done.returncode == SKIPPED:
        lines = (done.stdout + done.stderr).splitlines()
        reason = [line for line in lines if line.startswith("SKIP")] or lines[-1:] or ["(no reason given)"]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(name + "\n" + "\n".join(reason) + "\n")
    sys.exit(done.returncode)


main()
