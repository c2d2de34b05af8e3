#pragma once

// fulgor::metrics: torchmetrics' metrics, accumulated on the device and
// combined over the ranks of a ddp job (docs/training.md, "Metrics").

#include "fulgor/metrics/aggregation.h"
#include "fulgor/metrics/classification.h"
#include "fulgor/metrics/metric.h"
#include "fulgor/metrics/regression.h"
