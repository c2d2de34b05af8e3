#pragma once

// Forwarding header: this header moved to fulgor/loggers/logger.h, where new code
// includes it (docs/architecture.md).
#include "fulgor/loggers/logger.h"
