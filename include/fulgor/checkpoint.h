#pragma once

// Forwarding header: this header moved to fulgor/checkpoint/checkpoint.h, where new code
// includes it (docs/architecture.md).
#include "fulgor/checkpoint/checkpoint.h"
