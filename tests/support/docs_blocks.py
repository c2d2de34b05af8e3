"""Every code block of the README and docs/*.md, as a user copies it.

    docs_blocks.py --source-dir S --binary-dir B --work-dir W [--python P]
                   [--cmake CMAKE] [--cmake-arg ARG]... [--only PAGE.md]...

installs the fulgor built in B into W/prefix and, against that installed
package (find_package(fulgor), no precompiled header, warnings as errors):

- C++ blocks: each is a translation unit of one generated CMake project. A
  block with `main` is a program, built and run without arguments in its
  page's folder (W/<page>), where it must exit with 0; the others are compiled
  into one plugin library, which the installed fulgor-info must load, listing
  the accelerators they register. A block whose first line names a file
  (`// journeys.h`, `// my_accelerator.cpp: ...`) is written under that name
  in its page's folder, where a program of the same page may include it.
- CMake blocks: one that is a whole project (it has `project(`) is its page's
  CMakeLists.txt, built with the page's named files; a plugin it builds must
  load in the installed fulgor-info.
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
add_compile_options(-Wall -Wextra -Werror $<$<COMPILE_LANGUAGE:CXX>:-Wno-missing-field-initializers>)
"""

# The C API's programs: a language, how its whole programs begin, a suffix.
NATIVE = {"c": (re.compile(r"^int main\(", re.M), ".c"),
          "fortran": (re.compile(r"^program \w+", re.I | re.M), ".f90")}


def native_project(programs):
    """The CMake lines that build the C and Fortran programs."""
    languages = {block.lang for block, _, _ in programs}
    text = "enable_language(C)\n" if "c" in languages else ""
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
    module_sources, programs, projects, python_blocks, native_programs = [], [], [], [], []
    for page in pages:
        folder = work / page_name(page)
        folder.mkdir(parents=True)
        named_cpp, has_project = [], False
        for block in blocks(str(page)):
            block.path = str(page.relative_to(options.source_dir))
            fragment = FRAGMENT in block.markers
            if block.lang == "sh":
                check = subprocess.run(["bash", "-n"], input=block.code, capture_output=True, text=True)
                if check.returncode != 0:
                    sys.exit(f"{where(block)}: the shell block does not parse:\n{check.stderr}")
                missing = [t for t in shell_tools(block.code) if t not in installed]
                if missing:
                    sys.exit(f"{where(block)}: calls {missing}, which the installed fulgor has not "
                             f"(installed: {', '.join(sorted(installed))})")
                continue
            if fragment or block.lang not in ("cpp", "cmake", "python", *NATIVE):
                continue
            if block.lang in NATIVE:
                start, suffix = NATIVE[block.lang]
                if not start.search(block.code):
                    sys.exit(f"{where(block)}: a {block.lang} block that is not a whole program must be marked "
                             f"{FRAGMENT}")
                source = folder / f"{page_name(page)}_{block.line}{suffix}"
                source.write_text(block.code)
                native_programs.append((block, folder, source))
                continue
            if block.lang == "python":
                python_blocks.append((block, folder))
                continue
            if block.lang == "cmake":
                if "project(" not in block.code:
                    sys.exit(f"{where(block)}: a CMake block that is not a whole project must be marked "
                             f"{FRAGMENT}")
                (folder / "CMakeLists.txt").write_text(block.code)
                has_project = True
                projects.append((block, folder, named_cpp))
                continue
            name = FILE_NAME.match(block.code.split("\n", 1)[0])
            source = folder / (name.group(1) if name else f"{page_name(page)}_{block.line}.cpp")
            source.write_text(f"// {where(block)}\n{block.code}" if not name else block.code)
            if source.suffix == ".h":
                continue
            if re.search(r"^int main\(", block.code, re.M):
                programs.append((block, folder, source))
            elif name:
                named_cpp.append(source)
            else:
                module_sources.append(source)
        if not has_project:
            module_sources += named_cpp

    # One project for the blocks: two processors compile a few translation units.
    project = work / "project"
    project.mkdir()
    text = PROJECT
    if module_sources:
        text += f"add_library(docs_blocks MODULE {' '.join(map(str, module_sources))})\n"
        text += "target_link_libraries(docs_blocks PRIVATE fulgor::fulgor)\n"
    for i, (block, folder, source) in enumerate(programs):
        text += f"add_executable(docs_program_{i} {source})\n"
        text += f"target_include_directories(docs_program_{i} PRIVATE {folder})\n"
        text += f"target_link_libraries(docs_program_{i} PRIVATE fulgor::fulgor)\n"
    text += native_project(native_programs)
    (project / "CMakeLists.txt").write_text(text)
    print(f"compiling {len(module_sources)} blocks into a plugin, {len(programs)} programs and "
          f"{len(native_programs)} C and Fortran programs against the installed fulgor")
    cmake_project(options.cmake, project, project / "build", options.cmake_arg, prefix)
    # (--only a page that registers no accelerator: its blocks compiled is all there is to check.)
    if registered_names(module_sources):
        check_plugin(prefix, project / "build" / "libdocs_blocks.so", registered_names(module_sources))

    for i, (block, folder, source) in enumerate(programs):
        print(f"  {where(block)}: running the program")
        done = subprocess.run([project / "build" / f"docs_program_{i}"], cwd=folder, capture_output=True,
                              text=True, timeout=600)
        if done.returncode != 0:
            sys.exit(f"{where(block)}: the program exited with {done.returncode}:\n{done.stdout}{done.stderr}")

    for block, folder, sources in projects:
        print(f"  {where(block)}: building the project it shows")
        cmake_project(options.cmake, folder, folder / "build", options.cmake_arg, prefix)
        for library in (folder / "build").glob("*.so"):
            check_plugin(prefix, library, registered_names(sources))

    for block, folder in python_blocks:
        print(f"  {where(block)}: running it with {options.python}")
        # From a file, as a reader runs it: torch.jit.script reads the source of what it scripts.
        script = folder / f"{page_name(block.path)}_{block.line}.py"
        script.write_text(block.code)
        done = subprocess.run([options.python, script], cwd=folder, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            sys.exit(f"{where(block)}: the Python block failed:\n{done.stdout}{done.stderr}")

    for i, (block, folder, source) in enumerate(native_programs):
        print(f"  {where(block)}: running the {block.lang} program")
        done = subprocess.run([project / "build" / f"docs_native_{i}"], cwd=folder, capture_output=True, text=True,
                              timeout=600)
        if done.returncode != 0:
            sys.exit(f"{where(block)}: the program exited with {done.returncode}:\n{done.stdout}{done.stderr}")
    print("every code block compiles and runs as shown")


main()
