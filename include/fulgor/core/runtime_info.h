#pragma once

#include <string>

#include "fulgor/core/export.h"

namespace fulgor {

/// The BLAS library LibTorch's CPU matrix products run on in this process.
/// Debian's LibTorch uses whatever libblas the system's alternatives point to,
/// and the reference BLAS is several times slower than OpenBLAS.
struct BlasInfo {
  std::string name;  ///< "OpenBLAS", "BLIS", "MKL", "ATLAS", "reference BLAS", or "unknown"
  std::string path;  ///< the loaded library, symbolic links resolved; empty when none was found
  int threads = 0;   ///< the library's own thread count when it reports one, else 0
  /// How the library runs its threads, where it tells (OpenBLAS): "pthreads",
  /// "OpenMP" or "sequential"; else "".
  std::string threading;
  /// No BLAS library is loaded: LibTorch has one linked in, named by its build settings.
  bool linked_into_libtorch = false;
};

FULGOR_API BlasInfo blas_info();

/// LibTorch's intra-op thread count.
FULGOR_API int torch_threads();

/// Gives OpenBLAS one thread when it runs threads of its own (its pthreads
/// build), which would otherwise fight LibTorch's threads for the cores (Note
/// [BLAS threads] in src/core/runtime_info.cpp). Leaves it as it is when
/// OPENBLAS_NUM_THREADS is set. The CPU accelerator calls it when a loop
/// sets up its device. Returns whether it changed the count.
FULGOR_API bool limit_blas_threads();

}  // namespace fulgor
