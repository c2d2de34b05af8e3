#pragma once

// Forwarding header: this header moved to fulgor/optim/scheduler.h, where new code
// includes it (docs/architecture.md).
#include "fulgor/optim/scheduler.h"
