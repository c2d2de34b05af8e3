#pragma once

#include "fulgor/core/export.h"

// fulgor's release and its plugin ABI.
//
// FULGOR_PLUGIN_ABI_VERSION changes whenever a change to Accelerator, the
// registry or anything an accelerator plugin compiles against would make a
// plugin built for the old headers misbehave. Plugins carry the value they were
// compiled with (see REGISTER_ACCELERATOR) and the registry refuses any other.

#define FULGOR_VERSION_MAJOR 0
#define FULGOR_VERSION_MINOR 1
#define FULGOR_VERSION_PATCH 0
#define FULGOR_VERSION_STRING "0.1.0"

#define FULGOR_PLUGIN_ABI_VERSION 5

namespace fulgor {

/// The version of the fulgor library this process runs (may differ from the
/// headers a plugin was built with).
FULGOR_API const char* version();

/// The plugin ABI version of the fulgor library this process runs.
FULGOR_API int plugin_abi_version();

/// The LibTorch version this fulgor was built against, "MAJOR.MINOR.PATCH".
FULGOR_API const char* torch_version();

}  // namespace fulgor
