#include "fulgor/core/version.h"

#include <torch/version.h>

namespace fulgor {

const char* version() { return FULGOR_VERSION_STRING; }

int plugin_abi_version() { return FULGOR_PLUGIN_ABI_VERSION; }

const char* torch_version() { return TORCH_VERSION; }

}  // namespace fulgor
