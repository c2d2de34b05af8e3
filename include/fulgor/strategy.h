#pragma once

// Forwarding header: this header moved to fulgor/distributed/strategy.h, where new code
// includes it (docs/architecture.md).
#include "fulgor/distributed/strategy.h"
