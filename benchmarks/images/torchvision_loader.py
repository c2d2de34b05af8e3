"""torchvision's ImageFolder + DataLoader on the benchmark's pipeline
(decode, RandomResizedCrop 224, flip, normalise, batch 64), and TurboJPEG's
single-thread full-decode rate is measured by fulgor-data-bench's split.

Usage: torchvision_loader.py FOLDER [--workers N]
Last line: JSON with images_per_second and time_to_first_batch_s.
"""

import json
import resource
import sys
import time

import torch
from torchvision import datasets, transforms


def main():
    folder = sys.argv[1]
    workers = int(sys.argv[sys.argv.index("--workers") + 1]) if "--workers" in sys.argv else 2
    torch.set_num_threads(1)
    pipeline = transforms.Compose([
        transforms.RandomResizedCrop(224),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])
    data = datasets.ImageFolder(folder, pipeline)
    loader = torch.utils.data.DataLoader(data, batch_size=64, shuffle=True, num_workers=workers)
    start = time.perf_counter()
    first = None
    images = 0
    for batch, _ in loader:
        if first is None:
            first = time.perf_counter() - start
        images += batch.shape[0]
    elapsed = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 + \
        resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps({"images_per_second": images / elapsed, "images": images, "seconds": elapsed,
                      "time_to_first_batch_s": first, "workers": workers, "peak_rss_mb": peak}))


if __name__ == "__main__":
    main()
