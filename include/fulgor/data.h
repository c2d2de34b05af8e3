#pragma once

// fulgor's data loading: loaders over tensors, image folders and tar shards,
// the samplers that split them over the ranks, and the device prefetcher
// (docs/data.md).

#include "fulgor/data/any_loader.h"
#include "fulgor/data/data_loader.h"
#include "fulgor/data/epoch_sampler.h"
#include "fulgor/data/image_decode.h"
#include "fulgor/data/image_folder.h"
#include "fulgor/data/image_loader.h"
#include "fulgor/data/image_transforms.h"
#include "fulgor/data/loader_protocol.h"
#include "fulgor/data/prefetcher.h"
#include "fulgor/data/tar_shards.h"
#include "fulgor/data/tensor_loader.h"
