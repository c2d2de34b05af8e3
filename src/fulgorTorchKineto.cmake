# Note [Debian's kineto]
# Debian's LibTorch 2.x has kineto linked into libtorch_cpu and ships no
# libkineto, yet its TorchConfig.cmake looks for one and warns "static library
# kineto_LIBRARY-NOTFOUND not found" in every project that finds Torch. Where
# no libkineto is found, kineto_LIBRARY names LibTorch's torch_cpu target,
# which holds it, and TorchConfig takes that answer instead of searching.
# Included before find_package(Torch) by fulgor's build and by
# find_package(fulgor).
if(NOT DEFINED CACHE{kineto_LIBRARY})
  find_library(kineto_LIBRARY kineto)
endif()
if(NOT kineto_LIBRARY)
  set_property(CACHE kineto_LIBRARY PROPERTY VALUE torch_cpu)
endif()
