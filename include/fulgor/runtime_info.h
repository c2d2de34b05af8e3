#pragma once

#include <string>

namespace fulgor {

/// The BLAS library LibTorch's CPU matrix products run on in this process.
/// Debian's LibTorch uses whatever libblas the system's alternatives point to,
/// and the reference BLAS is several times slower than OpenBLAS.
struct BlasInfo {
  std::string name;  ///< "OpenBLAS", "BLIS", "MKL", "ATLAS", "reference BLAS", or "unknown"
  std::string path;  ///< the loaded library, symbolic links resolved; empty when none was found
  int threads = 0;   ///< the library's own thread count when it reports one, else 0
  /// No BLAS library is loaded: LibTorch has one linked in, named by its build settings.
  bool linked_into_libtorch = false;
};

BlasInfo blas_info();

/// LibTorch's intra-op thread count.
int torch_threads();

}  // namespace fulgor
