"""Every code block of the README and docs/*.md, as a user copies it.

    docs_blocks.py --source-dir S --binary-dir B --work-dir W [--python P]
                   [--cmake CMAKE] [--cmake-arg ARG]... [--only PAGE.md]...

installs the fulgor built in B into W/prefix and, against that installed
package (find_package(fulgor), no precompiled header, warnings as errors):

- C++ blocks: a block whose first line names a file (`// journeys.h`,
  `// my_accelerator.cpp: ...`) is written under that name in its page's
  folder (W/<page>). A block with `main` is a whole program: it must name its
  file, and its page must show the CMakeLists.txt that builds it (an
  `add_executable` of that file), with which it is built as a user builds it
  and run without arguments in its page's folder, where it must exit with 0.
  The other blocks are translation units of one generated CMake project,
  compiled into one plugin library, which the installed fulgor-info must
  load, listing the accelerators they register.
- CMake blocks: one that is a whole project (it has `project(`) is its page's
  CMakeLists.txt, built in W/<page>/build with the page's named files
  (warnings as errors); a plugin it builds must load in the installed
  fulgor-info.
- Runs: a plain block after the line `<!-- run: exit status N -->` is a
  transcript: each line `$ COMMAND` is run (split as the shell splits words,
  without a shell) in its page's folder after the page's programs are built,
  must exit with N, and must print (stdout, then stderr) the lines below it.
- Python blocks: run with P (Debian's python3 and python3-torch) in the
  page's folder, after its programs, so that they read what those wrote.
- C and Fortran blocks (the C API's): each must be a whole program (`int
  main(`, `program NAME`), built against fulgor::fulgor_c or fulgor::fortran
  (find_package(fulgor COMPONENTS Fortran)) and run without arguments in its
  page's folder after the Python blocks, so that it trains the model one of
  them wrote; it must exit with 0.
- Shell blocks: parsed with `bash -n`, and every fulgor tool they call by
  name must be installed; they are not run, as they build, train, or name
  paths of the reader's machine.

A block that is deliberately part of a program (a declaration, a snippet
inside a function) is preceded by the line `<!-- fragment -->`: it is not
compiled on its own (shell fragments are still parsed).
"""
import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from markdown_blocks import blocks

FRAGMENT = "<!-- fragment -->"
FILE_NAME = re.compile(r"// ([\w.-]+\.(?:h|cpp))(?::.*)?$")


def run(command, cwd=None, timeout=1800):
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {' '.join(map(str, command))}\n{done.stdout}{done.stderr}")
    return done.stdout


def where(block):
    return f"{block.path}:{block.line}"


def page_name(path):
    return Path(path).stem.lower()


def registered_names(sources):
    return sorted({name for source in sources
                   for name in re.findall(r'REGISTER_ACCELERATOR\("([^"]+)"', Path(source).read_text())})


def check_plugin(prefix, library, names):
    listing = run([prefix / "bin" / "fulgor-info", "--plugin", library])
    missing = [name for name in names if not re.search(rf"\n{re.escape(name)} ", listing)]
    if missing:
        sys.exit(f"the installed fulgor-info does not list {missing} from {library}:\n{listing}")
    print(f"  fulgor-info --plugin {library.name}: lists {', '.join(names)}")


def cmake_project(cmake, source, build, args, prefix):
    run([cmake, "-S", source, "-B", build, f"-DCMAKE_PREFIX_PATH={prefix}", *args])
    run([cmake, "--build", build])


PROJECT = """cmake_minimum_required(VERSION 3.18)
project(fulgor_docs_blocks LANGUAGES CXX)
find_package(fulgor REQUIRED)
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
"""
# Nothing a docs block compiles may warn; C++17 mode warns about the fields a
# designated initialiser leaves at their defaults, which the docs do on purpose.
WARNINGS = "-DCMAKE_CXX_FLAGS=-Wall -Wextra -Werror -Wno-missing-field-initializers"
RUN = re.compile(r"<!-- run: exit status (\d+) -->")
EXECUTABLE = re.compile(r"add_executable\(\s*([\w.-]+)\s+([^)]*)\)")

# The C API's programs: a language, how its whole programs begin, a suffix.
NATIVE = {"c": (re.compile(r"^int main\(", re.M), ".c"),
          "fortran": (re.compile(r"^program \w+", re.I | re.M), ".f90")}


def native_project(programs):
    """The CMake lines that build the C and Fortran programs."""
    languages = {block.lang for block, _, _ in programs}
    warnings = " ".join(f"$<$<COMPILE_LANGUAGE:C>:{flag}>" for flag in ("-Wall", "-Wextra", "-Werror"))
    text = f"enable_language(C)\nadd_compile_options({warnings})\n" if "c" in languages else ""
    if "fortran" in languages:
        text += "enable_language(Fortran)\nfind_package(fulgor REQUIRED COMPONENTS Fortran)\n"
    for i, (block, folder, source) in enumerate(programs):
        target = f"docs_native_{i}"
        text += f"add_executable({target} {source})\n"
        if block.lang == "c":
            text += f"target_link_libraries({target} PRIVATE fulgor::fulgor_c)\n"
        else:
            # Each program compiles the module `fulgor` itself: one folder of modules each.
            text += f"target_link_libraries({target} PRIVATE fulgor::fortran)\n"
            text += (f"set_target_properties({target} PROPERTIES Fortran_MODULE_DIRECTORY "
                     f"${{CMAKE_CURRENT_BINARY_DIR}}/{target}_modules)\n")
    return text


def shell_tools(code):
    """The fulgor-* programs a shell block calls by bare name."""
    tools = []
    for line in code.split("\n"):
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue  # a line continued on the next; bash -n judges the block
        command_position = True
        for word in words:
            if command_position and re.fullmatch(r"\w+=.*", word):
                continue
            if command_position and re.fullmatch(r"fulgor-[\w-]+", word):
                tools.append(word)
            command_position = word in ("&&", "||", "|", ";", "--", "then", "do", "srun", "xargs")
    return tools


class Blocks:
    """What the pages hold, by kind; each entry keeps its block and page folder."""

    def __init__(self):
        self.module_sources, self.programs, self.projects, self.runs, self.python = [], [], [], [], []
        self.native = []  # the C API's C and Fortran programs


def check_shell(block, installed):
    check = subprocess.run(["bash", "-n"], input=block.code, capture_output=True, text=True)
    if check.returncode != 0:
        sys.exit(f"{where(block)}: the shell block does not parse:\n{check.stderr}")
    missing = [t for t in shell_tools(block.code) if t not in installed]
    if missing:
        sys.exit(f"{where(block)}: calls {missing}, which the installed fulgor has not "
                 f"(installed: {', '.join(sorted(installed))})")


def read_page(page, source_dir, folder, installed, found):
    """Writes the page's blocks into its folder and adds them to `found`."""
    named_cpp, has_project = [], False
    for block in blocks(str(page)):
        block.path = str(page.relative_to(source_dir))
        run = next((RUN.fullmatch(m) for m in block.markers if RUN.fullmatch(m)), None)
        if run:
            found.runs.append((block, folder, int(run.group(1))))
            continue
        if block.lang == "sh":
            check_shell(block, installed)
            continue
        if FRAGMENT in block.markers or block.lang not in ("cpp", "cmake", "python", *NATIVE):
            continue
        if block.lang in NATIVE:
            start, suffix = NATIVE[block.lang]
            if not start.search(block.code):
                sys.exit(f"{where(block)}: a {block.lang} block that is not a whole program must be marked {FRAGMENT}")
            source = folder / f"{page_name(page)}_{block.line}{suffix}"
            source.write_text(block.code)
            found.native.append((block, folder, source))
        elif block.lang == "python":
            found.python.append((block, folder))
        elif block.lang == "cmake":
            if "project(" not in block.code:
                sys.exit(f"{where(block)}: a CMake block that is not a whole project must be marked {FRAGMENT}")
            if has_project:
                sys.exit(f"{where(block)}: a second whole project on one page; each page's folder has one")
            (folder / "CMakeLists.txt").write_text(block.code)
            has_project = True
            found.projects.append((block, folder, named_cpp))
        else:
            name = FILE_NAME.match(block.code.split("\n", 1)[0])
            is_program = re.search(r"^int main\(", block.code, re.M)
            if is_program and not name:
                sys.exit(f"{where(block)}: a whole program must name its file on its first line "
                         f"(// train.cpp), so that the CMakeLists.txt beside it can build it")
            source = folder / (name.group(1) if name else f"{page_name(page)}_{block.line}.cpp")
            source.write_text(block.code if name else f"// {where(block)}\n{block.code}")
            if is_program:
                found.programs.append((block, folder, source))
            elif source.suffix == ".cpp":
                (named_cpp if name else found.module_sources).append(source)
    if not has_project:
        found.module_sources += named_cpp


def executable_of(block, folder, source, projects):
    """The program its page's CMakeLists.txt makes of `source`."""
    for project, project_folder, _ in projects:
        if project_folder != folder:
            continue
        for target, sources in EXECUTABLE.findall(project.code):
            if source.name in sources.split():
                return folder / "build" / target
    sys.exit(f"{where(block)}: the program {source.name} has no CMakeLists.txt beside it: its page must show "
             f"a ```cmake block, a whole project with add_executable(NAME {source.name})")


def build_module_sources(options, work, prefix, sources):
    """The blocks that are no program nor a page's project: one plugin."""
    project = work / "project"
    project.mkdir()
    text = PROJECT + f"add_library(docs_blocks MODULE {' '.join(map(str, sources))})\n"
    text += "target_link_libraries(docs_blocks PRIVATE fulgor::fulgor)\n"
    (project / "CMakeLists.txt").write_text(text)
    print(f"compiling {len(sources)} blocks into a plugin against the installed fulgor")
    cmake_project(options.cmake, project, project / "build", [*options.cmake_arg, WARNINGS], prefix)
    # (--only a page that registers no accelerator: its blocks compiled is all there is to check.)
    if registered_names(sources):
        check_plugin(prefix, project / "build" / "libdocs_blocks.so", registered_names(sources))


def build_native_programs(options, work, prefix, programs):
    """The C API's C and Fortran programs, built and run after the Python blocks that write their models."""
    project = work / "native"
    project.mkdir()
    (project / "CMakeLists.txt").write_text(PROJECT + native_project(programs))
    print(f"compiling {len(programs)} C and Fortran programs against the installed fulgor")
    cmake_project(options.cmake, project, project / "build", options.cmake_arg, prefix)
    for i, (block, folder, source) in enumerate(programs):
        print(f"  {where(block)}: running the {block.lang} program")
        run_in(block, folder, [project / "build" / f"docs_native_{i}"], "the program", 600)


def check_run(block, folder, status):
    """Runs each `$ COMMAND` of a transcript and compares what it prints."""
    commands = [line for line in block.code.split("\n") if line.startswith("$ ")]
    expected = block.code.rstrip("\n").split("\n")
    for command in commands:
        start = expected.index(command) + 1
        end = next((i for i in range(start, len(expected)) if expected[i].startswith("$ ")), len(expected))
        done = subprocess.run(shlex.split(command[2:]), cwd=folder, capture_output=True, text=True, timeout=300)
        printed = (done.stdout + done.stderr).rstrip("\n").split("\n")
        if done.returncode != status or printed != expected[start:end]:
            sys.exit(f"{where(block)}: `{command[2:]}` exited with {done.returncode} (the docs say {status}) "
                     f"and printed\n{done.stdout}{done.stderr}\nwhere the docs show\n" +
                     "\n".join(expected[start:end]))
        print(f"  {where(block)}: `{command[2:]}` exits with {status}, printing what the docs show")


def run_in(block, folder, command, what, timeout):
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        sys.exit(f"{where(block)}: {what} exited with {done.returncode}:\n{done.stdout}{done.stderr}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--source-dir", type=Path, required=True)
    parser.add_argument("--binary-dir", type=Path, required=True)
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--python", default="/usr/bin/python3")
    parser.add_argument("--cmake", default="cmake")
    parser.add_argument("--cmake-arg", action="append", default=[])
    parser.add_argument("--only", action="append", default=[])
    options = parser.parse_args()
    work = options.work_dir.resolve()
    run(["rm", "-rf", work])
    prefix = work / "prefix"
    run([options.cmake, "--install", options.binary_dir, "--prefix", prefix])
    installed = {p.name for p in (prefix / "bin").iterdir()}

    pages = [options.source_dir / "README.md"] + sorted((options.source_dir / "docs").glob("*.md"))
    if options.only:
        pages = [p for p in pages if str(p.relative_to(options.source_dir)) in options.only]
    found = Blocks()
    for page in pages:
        folder = work / page_name(page)
        folder.mkdir(parents=True)
        read_page(page, options.source_dir, folder, installed, found)
    executables = [executable_of(block, folder, source, found.projects)
                   for block, folder, source in found.programs]

    if found.module_sources:
        build_module_sources(options, work, prefix, found.module_sources)
    for block, folder, sources in found.projects:
        print(f"  {where(block)}: building the project it shows")
        cmake_project(options.cmake, folder, folder / "build", [*options.cmake_arg, WARNINGS], prefix)
        for library in (folder / "build").glob("*.so"):
            check_plugin(prefix, library, registered_names(sources))
    for (block, folder, source), executable in zip(found.programs, executables):
        print(f"  {where(block)}: running {source.name}, built as {executable.relative_to(folder)}")
        run_in(block, folder, [executable], "the program", 600)
    for block, folder, status in found.runs:
        check_run(block, folder, status)
    for block, folder in found.python:
        print(f"  {where(block)}: running it with {options.python}")
        # From a file, as a reader runs it: torch.jit.script reads the source of what it scripts.
        script = folder / f"{page_name(block.path)}_{block.line}.py"
        script.write_text(block.code)
        run_in(block, folder, [options.python, script], "the Python block", 300)
    if found.native:
        build_native_programs(options, work, prefix, found.native)
    print("every code block compiles and runs as shown")


main()
