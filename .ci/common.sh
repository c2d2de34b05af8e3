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
