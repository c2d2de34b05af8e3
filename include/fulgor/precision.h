#pragma once

// Forwarding header: this header moved to fulgor/precision/precision.h, where new code
// includes it (docs/architecture.md).
#include "fulgor/precision/precision.h"
