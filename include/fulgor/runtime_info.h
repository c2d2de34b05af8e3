#pragma once

// Forwarding header: this header moved to fulgor/core/runtime_info.h, where new code
// includes it (docs/architecture.md).
#include "fulgor/core/runtime_info.h"
