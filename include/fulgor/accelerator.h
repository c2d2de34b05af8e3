#pragma once

// Forwarding header: this header moved to fulgor/core/accelerator.h, where new code
// includes it (docs/architecture.md).
#include "fulgor/core/accelerator.h"
