#pragma once

// Forwarding header: this header moved to fulgor/core/devices.h, where new code
// includes it (docs/architecture.md).
#include "fulgor/core/devices.h"
