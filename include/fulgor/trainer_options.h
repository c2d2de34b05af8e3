#pragma once

// Forwarding header: this header moved to fulgor/config/trainer_options.h, where new code
// includes it (docs/architecture.md).
#include "fulgor/config/trainer_options.h"
