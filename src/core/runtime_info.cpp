#include "fulgor/core/runtime_info.h"

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <dlfcn.h>
#include <link.h>

#include <climits>
#include <cstdlib>
#include <cstring>

namespace fulgor {
namespace {

bool is_blas_library(const char* path) {
  const char* slash = std::strrchr(path, '/');
  const char* base = slash ? slash + 1 : path;
  for (const char* prefix : {"libblas.so", "libopenblas", "libmkl_rt", "libblis", "libcblas.so"})
    if (std::strncmp(base, prefix, std::strlen(prefix)) == 0) return true;
  return false;
}

std::string classify(const std::string& path) {
  auto has = [&](const char* part) { return path.find(part) != std::string::npos; };
  if (has("openblas")) return "OpenBLAS";
  if (has("blis")) return "BLIS";
  if (has("mkl")) return "MKL";
  if (has("atlas")) return "ATLAS";
  if (has("/blas/") || has("netlib")) return "reference BLAS";
  return "unknown";
}

// The BLAS LibTorch was built with, from its build settings ("BLAS_INFO=mkl"),
// or "" when they do not say.
std::string configured_blas() {
  const std::string config = at::show_config();
  const std::string key = "BLAS_INFO=";
  const size_t found = config.find(key);
  if (found == std::string::npos) return "";
  const size_t begin = found + key.size();
  const std::string value = config.substr(begin, config.find_first_of(", \n", begin) - begin);
  if (value == "mkl") return "MKL";
  if (value == "open" || value == "openblas") return "OpenBLAS";
  if (value == "blis") return "BLIS";
  return value;
}

// OpenBLAS's openblas_get_parallel: 0 sequential, 1 pthreads, 2 OpenMP; ""
// for another library.
std::string openblas_threading() {
  using GetParallel = int (*)();
  const auto get = reinterpret_cast<GetParallel>(dlsym(RTLD_DEFAULT, "openblas_get_parallel"));
  if (get == nullptr) return "";
  switch (get()) {
    case 0:
      return "sequential";
    case 1:
      return "pthreads";
    case 2:
      return "OpenMP";
    default:
      return "";
  }
}

}  // namespace

BlasInfo blas_info() {
  std::string found;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        if (info->dlpi_name == nullptr || !is_blas_library(info->dlpi_name)) return 0;
        *static_cast<std::string*>(out) = info->dlpi_name;
        return 1;
      },
      &found);
  BlasInfo info;
  if (found.empty()) {
    // No BLAS library of its own is loaded: PyTorch's own builds link MKL
    // into LibTorch.
    info.name = configured_blas();
    info.linked_into_libtorch = !info.name.empty();
    if (info.name.empty()) info.name = "unknown";
    return info;
  }
  char resolved[PATH_MAX];
  info.path = realpath(found.c_str(), resolved) ? resolved : found;
  info.name = classify(info.path);
  // OpenBLAS answers how many threads it uses; other libraries have no common call.
  using GetThreads = int (*)();
  if (auto get = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"))) info.threads = get();
  info.threading = openblas_threading();
  return info;
}

int torch_threads() { return at::get_num_threads(); }

// Note [BLAS threads]
// LibTorch parallelises its CPU kernels over its own OpenMP threads, and the
// BLAS it calls may parallelise too. OpenBLAS's OpenMP build shares LibTorch's
// OpenMP runtime, but its pthreads build (the one Debian's libopenblas0
// selects) starts threads of its own for a product, which then compete for
// the cores with LibTorch's threads (busy-waiting between kernels) and with
// one another: on a 2-core Debian 13 machine (OpenBLAS 0.3.29) an epoch of the
// Fashion-MNIST example took 36 s, and 10 s with one BLAS thread or with the
// OpenMP build (Debian 12's OpenBLAS 0.3.21 lost little: 15 s against 14). So
// the pthreads build gets one thread, as OPENBLAS_NUM_THREADS=1 gives it, and
// LibTorch's threads do the parallel work; a count the user chose stands.
bool limit_blas_threads() {
  if (std::getenv("OPENBLAS_NUM_THREADS") != nullptr) return false;
  if (openblas_threading() != "pthreads") return false;
  using GetThreads = int (*)();
  using SetThreads = void (*)(int);
  const auto get = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  const auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (get == nullptr || set == nullptr || get() <= 1) return false;
  set(1);
  return true;
}

}  // namespace fulgor
