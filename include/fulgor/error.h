#pragma once

// Forwarding header: this header moved to fulgor/core/error.h, where new code
// includes it (docs/architecture.md).
#include "fulgor/core/error.h"
