#pragma once

#include <stdexcept>
#include <string>

#include "fulgor/core/export.h"

namespace fulgor {

/// Base of every exception fulgor throws. Messages name the offending value and
/// what would have been accepted.
class FULGOR_API Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// An option or argument has a value fulgor does not accept.
class FULGOR_API ConfigError : public Error {
 public:
  using Error::Error;
};

/// A name was not found in, or clashes with, the accelerator registry.
class FULGOR_API RegistryError : public Error {
 public:
  using Error::Error;
};

/// An accelerator plugin could not be loaded.
class FULGOR_API PluginError : public Error {
 public:
  using Error::Error;
};

/// An accelerator was asked for something its device cannot do here.
class FULGOR_API DeviceError : public Error {
 public:
  using Error::Error;
};

/// A collective of a distributed job failed: a peer exited, stopped answering
/// within the timeout, or could not be reached.
class FULGOR_API DistributedError : public Error {
 public:
  using Error::Error;
};

/// A checkpoint file cannot be written, or is missing, truncated, corrupted or
/// not a fulgor checkpoint. The message names the file and what is wrong.
class FULGOR_API CheckpointError : public Error {
 public:
  using Error::Error;
};

/// A file in another framework's format (torch.save, Lightning, safetensors)
/// cannot be read or written: it is malformed, truncated, corrupted, or holds
/// something fulgor refuses to load (a pickled global outside the allow-list).
/// The message names the file and what is wrong.
class FULGOR_API InteropError : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

}  // namespace fulgor
