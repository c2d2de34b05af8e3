#pragma once

// Forwarding header: this header moved to fulgor/data/distributed_sampler.h, where new
// code includes it (docs/architecture.md).
#include "fulgor/data/distributed_sampler.h"
