# Shared by .ci/run and the quick start. Sourced, not run.

FULGOR_PACKAGES="libtorch-dev libfmt-dev nlohmann-json3-dev libgtest-dev libgloo-dev libopenblas0 zlib1g-dev libxxhash-dev xxhash dataset-fashion-mnist cmake g++ make git protobuf-compiler python3 python3-torch gfortran libturbojpeg0-dev libpng-dev"
# What CI adds to a user's machine: a compiler cache and Ninja (ci_environment).
FULGOR_CI_PACKAGES="ccache ninja-build"

# The README's test command, in its two parts, so that CI can time each.
fulgor_build_command() {
  cmake -S . -B build && cmake --build build -j"$(nproc)"
}
fulgor_ctest_command() {
  ctest --test-dir build -j"$(nproc)" --output-on-failure
}

# Note [CI's compiler cache]
# CI builds with ccache and Ninja through the environment alone, so that the
# README's commands stay what a user runs. The cache ($1) persists on the
# machine (CI runs on the machine of the session that submits, whose builds
# filled it). CCACHE_BASEDIR makes the paths inside the tree relative, so a
# build in another folder hits most of what a build of the same tree stored;
# not the test sources whose compile definitions name programs by absolute
# path, which is why .ci/run builds at fixed paths.
# The sloppiness lets the precompiled <torch/torch.h> be cached and used:
# CMake includes it with -include, and its .gch is newer than the sources.
# The depend mode keys a compilation by the headers its -MD list names,
# where ccache would otherwise run the preprocessor on every miss: about a
# second for LibTorch's headers (which the preprocessor reads as text, not
# from the .gch), a third of a header-check unit's time.
ci_environment() {
  export CCACHE_DIR=$1 CCACHE_BASEDIR=$PWD CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-8G} CCACHE_DEPEND=1
  export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_GENERATOR=Ninja
  mkdir -p "$CCACHE_DIR"
}

install_packages_on_host() {
  local missing=()
  for p in $FULGOR_PACKAGES $FULGOR_CI_PACKAGES debootstrap; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
}

# Zeroes the compiler cache's statistics, where CI uses one.
cache_zero() {
  [ -z "${CMAKE_CXX_COMPILER_LAUNCHER:-}" ] || ccache -z >/dev/null
}
# The compiler cache's hits since cache_zero, as "HITS/CALLS", or "none".
cache_hits() {
  if [ -n "${CMAKE_CXX_COMPILER_LAUNCHER:-}" ]; then
    ccache -s | awk '/^ *Hits:/ { print $2 "/" $4; exit }'
  else
    echo none
  fi
}

# Seconds since $1, as minutes with one decimal.
minutes_since() {
  awk -v s=$((SECONDS - $1)) 'BEGIN { printf "%.1f", s / 60 }'
}

# Runs a phase of a stage, the command $2 (a build or its tests), logged, and
# prints "minutes MIN" and what the command $3 prints of the label $1 and the
# log on standard output; on failure all of the log goes to standard error,
# and "$1: FAILED".
timed_phase() {
  local label=$1 phase=$2 report=$3 log t
  log=$(mktemp)
  t=$SECONDS
  cache_zero
  if $phase >"$log" 2>&1; then
    echo "minutes $(minutes_since $t)"
    $report "$label" "$log"
    return 0
  fi
  cat "$log" >&2
  echo "$label: FAILED" >&2
  return 1
}
# What a build phase reports: the compiler cache's hits.
build_report() { echo "cache $(cache_hits)"; }
# What a test phase reports: the log's last lines on standard error, and the
# result the command $3 reads in it.
tests_report() {
  tail -n 40 "$2" >&2
  echo "result $1: $($3 "$2")"
}

# Runs the phase $2 (build or tests) of the test command in $1, with the CMake
# options $3 (CI's, set before the command configures) if any; prints what
# timed_phase prints.
run_suite() {
  cd "$1"
  suite_options=${3:-}
  local torch
  torch=$(sed -n 's/^#define TORCH_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)/\2/p' \
    /usr/include/torch/csrc/api/include/torch/version.h | paste -sd.)
  case $2 in
    build) timed_phase "LibTorch $torch" suite_build build_report ;;
    tests) timed_phase "LibTorch $torch" fulgor_ctest_command suite_report ;;
  esac
}
suite_build() {
  # shellcheck disable=SC2086 # options are words
  { [ -z "$suite_options" ] || cmake -S . -B build $suite_options; } && fulgor_build_command
}
suite_report() { tests_report "$1" "$2" suite_result; }
suite_result() { grep -E 'tests passed' "$1" | tail -n 1; }

# The sanitizer stage (Note [Sanitizers] in CMakeLists.txt), on the host's
# LibTorch: the core and Trainer tests and the fuzz corpora's replay (the
# registry, devices, plugins, options and config files, the loops,
# checkpoints, callbacks, loggers, image decoders and tar shards) under ASan,
# LeakSanitizer and UBSan, built in a folder of its own at -O0: three times as
# fast to build as at -O1, and the tests take as long, their work running in
# LibTorch. Each test executable runs as one process, which loads LibTorch
# under ASan once. The SIGKILL test is left out: it restarts a writer up to 30
# times, each starting LibTorch, slow under ASan, and it checks files, not
# memory. $2 is the phase, build or tests; prints what timed_phase prints.
run_sanitized_suite() {
  cd "$1"
  case $2 in
    build) timed_phase "ASan+UBSan" sanitized_build build_report ;;
    tests) timed_phase "ASan+UBSan" sanitized_tests sanitized_report ;;
  esac
}
sanitized_build() {
  cmake -S . -B build-sanitize -DFULGOR_SANITIZE=address,undefined -DCMAKE_CXX_FLAGS_RELEASE="-O0 -DNDEBUG" -DFULGOR_TESTS_OPTIMIZE= \
    -DFULGOR_BUILD_EXAMPLES=OFF -DFULGOR_BUILD_CONFORMANCE=OFF &&
    cmake --build build-sanitize -j"$(nproc)" --target fulgor_core_tests fulgor_trainer_tests fulgor_fuzz_replay
}
sanitized_tests() {
  local b=build-sanitize
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
  $b/tests/fulgor_core_tests &&
    $b/tests/fulgor_trainer_tests --gtest_filter=-CheckpointTemporaries.AWriterKilledAtRandomMomentsLeavesLoadableCheckpoints &&
    $b/tests/fuzz/fulgor_fuzz_replay devices tests/fuzz/corpus/devices &&
    $b/tests/fuzz/fulgor_fuzz_replay options tests/fuzz/corpus/options &&
    $b/tests/fuzz/fulgor_fuzz_replay checkpoint tests/fuzz/corpus/checkpoint &&
    $b/tests/fuzz/fulgor_fuzz_replay image tests/fuzz/corpus/image &&
    $b/tests/fuzz/fulgor_fuzz_replay tar_shard tests/fuzz/corpus/tar_shard
}
sanitized_report() { tests_report "$1" "$2" sanitized_result; }
sanitized_result() {
  echo "$(grep -cE '^\[       OK \]' "$1") core and Trainer tests passed, fuzz corpora replayed"
}

# Copies the files git tracks in this folder to $1, replacing what was there.
copy_tree() {
  rm -rf "$1" && mkdir -p "$1" && git ls-files -z | xargs -0 cp --parents -t "$1"
}

make_trixie_root() {
  local root=$1
  if [ ! -x "$root/usr/bin/apt-get" ]; then
    rm -rf "$root" && mkdir -p "$(dirname "$root")"
    debootstrap --variant=minbase trixie "$root" >&2
  fi
}

enter_root() {
  local root=$1 d
  for d in proc sys dev; do mountpoint -q "$root/$d" || mount --bind "/$d" "$root/$d"; done
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  chroot "$root" bash -c "dpkg-query -W $FULGOR_PACKAGES $FULGOR_CI_PACKAGES >/dev/null 2>&1 || { apt-get update -q &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $FULGOR_PACKAGES $FULGOR_CI_PACKAGES; }" >&2
}

leave_root() {
  local root=$1 d
  for d in dev sys proc; do mountpoint -q "$root/$d" && umount -l "$root/$d" || true; done
}
