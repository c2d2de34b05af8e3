#pragma once

// Forwarding header: this header moved to fulgor/config/cli.h, where new code
// includes it (docs/architecture.md).
#include "fulgor/config/cli.h"
