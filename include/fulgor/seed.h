#pragma once

// Forwarding header: this header moved to fulgor/config/seed.h, where new code
// includes it (docs/architecture.md).
#include "fulgor/config/seed.h"
