"""PyTorch's side of the interop benchmark: median seconds of torch.load
(weights_only=True) of FILE and of torch.save of what it loaded to OUT.

  interop_reference.py FILE OUT REPEATS   prints {"load": S, "save": S}
"""

import json
import statistics
import sys
import time

import torch


def median_seconds(function, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


path, out, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
state = torch.load(path, weights_only=True)
print(json.dumps({"load": median_seconds(lambda: torch.load(path, weights_only=True), repeats),
                  "save": median_seconds(lambda: torch.save(state, out), repeats)}))
