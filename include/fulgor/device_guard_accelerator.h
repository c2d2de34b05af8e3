#pragma once

// Forwarding header: this header moved to fulgor/core/device_guard_accelerator.h, where new code
// includes it (docs/architecture.md).
#include "fulgor/core/device_guard_accelerator.h"
