#pragma once

// Forwarding header: this header moved to fulgor/optim/manual_optimizer.h, where new code
// includes it (docs/architecture.md).
#include "fulgor/optim/manual_optimizer.h"
