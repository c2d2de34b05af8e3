#pragma once

// Everything fulgor offers, for programs that do not want to pick headers.

#include "fulgor/accelerator.h"
#include "fulgor/batch.h"
#include "fulgor/data/prefetcher.h"
#include "fulgor/data/tensor_loader.h"
#include "fulgor/device_guard_accelerator.h"
#include "fulgor/devices.h"
#include "fulgor/distributed/environment.h"
#include "fulgor/distributed/gradient_sync.h"
#include "fulgor/distributed/process_group.h"
#include "fulgor/distributed/sampler.h"
#include "fulgor/error.h"
#include "fulgor/precision.h"
#include "fulgor/registry.h"
#include "fulgor/runtime_info.h"
#include "fulgor/version.h"
