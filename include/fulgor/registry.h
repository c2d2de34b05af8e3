#pragma once

// Forwarding header: this header moved to fulgor/core/registry.h, where new code
// includes it (docs/architecture.md).
#include "fulgor/core/registry.h"
