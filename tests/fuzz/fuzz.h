#pragma once

// The fuzz targets: each runs one input through a parser of outside input and
// returns when the input was taken or refused with a fulgor::Error, the
// documented way to refuse. Anything else escaping (another exception, a
// crash, a sanitizer's report, a broken promise checked with require) is a
// finding.
//
// Built with FULGOR_FUZZ=ON (clang), each file is a libFuzzer harness;
// otherwise fulgor_fuzz_replay runs every file of a corpus folder through
// them, so that each finding, kept as a seed, stays fixed.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace fulgor::fuzz {

/// The input as a `devices` value, on the parsers every accelerator uses.
void devices(const uint8_t* data, size_t size);
/// The input as a config file and a command line (see options_fuzz.cpp).
void options(const uint8_t* data, size_t size);
/// The input as a checkpoint file, or as the metadata of one that is
/// otherwise valid (see checkpoint_fuzz.cpp).
void checkpoint(const uint8_t* data, size_t size);

/// The input as a torch.save file, or as a bare pickle (see torch_file_fuzz.cpp).
void torch_file(const uint8_t* data, size_t size);
/// The input as a .safetensors file, read and written back.
void safetensors(const uint8_t* data, size_t size);
/// The input as a distributed checkpoint's .metadata, read and written back.
void dcp_metadata(const uint8_t* data, size_t size);

/// The input as a JPEG or PNG image, decoded whole and as a scaled region
/// (see image_fuzz.cpp).
void image(const uint8_t* data, size_t size);
/// The input as a tar shard, and its index where it holds one (see
/// tar_shard_fuzz.cpp).
void tar_shard(const uint8_t* data, size_t size);

/// Writes the valid checkpoint the checkpoint target's seeds start from: a
/// one-parameter module after one epoch, with the callbacks' states.
void write_checkpoint_seed(const std::string& path);
/// Writes the valid images of the image target's seeds into `folder`: JPEGs
/// of each chroma subsampling and progressive, PNGs of each colour type.
void write_image_seeds(const std::string& folder);

/// Ends the process, naming the promise, when it does not hold.
inline void require(bool condition, const char* what) {
  if (condition) return;
  std::fprintf(stderr, "fuzz: broken promise: %s\n", what);
  std::abort();
}

}  // namespace fulgor::fuzz

#ifdef FULGOR_LIBFUZZER
#define FULGOR_FUZZ_TARGET(function)                                        \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { \
    function(data, size);                                                   \
    return 0;                                                               \
  }
#else
#define FULGOR_FUZZ_TARGET(function)
#endif
