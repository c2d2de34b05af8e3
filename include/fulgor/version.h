#pragma once

// Forwarding header: this header moved to fulgor/core/version.h, where new code
// includes it (docs/architecture.md).
#include "fulgor/core/version.h"
