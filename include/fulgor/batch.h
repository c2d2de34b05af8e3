#pragma once

// Forwarding header: this header moved to fulgor/core/batch.h, where new code
// includes it (docs/architecture.md).
#include "fulgor/core/batch.h"
