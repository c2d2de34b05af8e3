# Shared by .ci/run and the quick start. Sourced, not run.

FULGOR_PACKAGES="libtorch-dev libfmt-dev nlohmann-json3-dev libgtest-dev libgloo-dev libopenblas0 zlib1g-dev libxxhash-dev xxhash dataset-fashion-mnist cmake g++ make git protobuf-compiler python3"

# The README's test command.
fulgor_test_command() {
  cmake -S . -B build && cmake --build build -j"$(nproc)" && ctest --test-dir build -j"$(nproc)" --output-on-failure
}

install_packages_on_host() {
  local missing=()
  for p in $FULGOR_PACKAGES debootstrap; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
}

# Runs the test command in $1; prints (last) one summary line for this LibTorch.
run_suite() {
  local dir=$1 log
  log=$(mktemp)
  cd "$dir"
  local torch
  torch=$(sed -n 's/^#define TORCH_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)/\2/p' \
    /usr/include/torch/csrc/api/include/torch/version.h | paste -sd.)
  if fulgor_test_command >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "LibTorch $torch: $(grep -E 'tests passed' "$log" | tail -n 1)"
  else
    cat "$log" >&2
    echo "LibTorch $torch: FAILED" >&2
    return 1
  fi
}

# The sanitizer stage (Note [Sanitizers] in CMakeLists.txt), on the host's
# LibTorch: the core and Trainer tests and the fuzz corpora's replay (the
# registry, devices, plugins, options and config files, the loops,
# checkpoints, callbacks, loggers) under ASan, LeakSanitizer and UBSan, built
# at -O1 in a folder of its own. Each test executable runs as one process,
# which loads LibTorch under ASan once. The SIGKILL test is left out: it
# restarts a writer 30 times within a minute, which a writer starting under
# ASan cannot keep to, and it checks files, not memory. Prints one summary line.
run_sanitized_suite() {
  local dir=$1 log
  log=$(mktemp)
  cd "$dir"
  local b=build-sanitize
  if { cmake -S . -B $b -DFULGOR_SANITIZE=address,undefined -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
         -DFULGOR_BUILD_EXAMPLES=OFF -DFULGOR_BUILD_CONFORMANCE=OFF &&
       cmake --build $b -j"$(nproc)" --target fulgor_core_tests fulgor_trainer_tests fulgor_fuzz_replay &&
       export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 &&
       $b/tests/fulgor_core_tests && $b/tests/fulgor_trainer_tests --gtest_filter=-Checkpoint.AWriterKilledAtRandomMomentsLeavesLoadableCheckpoints &&
       $b/tests/fuzz/fulgor_fuzz_replay devices tests/fuzz/corpus/devices &&
       $b/tests/fuzz/fulgor_fuzz_replay options tests/fuzz/corpus/options &&
       $b/tests/fuzz/fulgor_fuzz_replay checkpoint tests/fuzz/corpus/checkpoint; } >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    echo "ASan+UBSan: $(grep -cE '^\[       OK \]' "$log") core and Trainer tests passed, fuzz corpora replayed"
  else
    cat "$log" >&2
    echo "ASan+UBSan: FAILED" >&2
    return 1
  fi
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
  chroot "$root" bash -c "dpkg-query -W $FULGOR_PACKAGES >/dev/null 2>&1 || { apt-get update -q &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $FULGOR_PACKAGES; }" >&2
}

leave_root() {
  local root=$1 d
  for d in dev sys proc; do mountpoint -q "$root/$d" && umount -l "$root/$d" || true; done
}
