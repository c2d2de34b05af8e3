"""Records torch.optim.swa_utils.AveragedModel's averages over a fixed
sequence of weights, as JSON, for weight_averaging_test.cpp to compare
fulgor's AveragedModel with value by value.

Usage: /usr/bin/python3 weight_averaging_reference.py OUTPUT.json
The weights after update k are, for tensor j and flat element e,
sin(0.37 k + 0.11 e + 0.7 j) * (1 + 0.01 k), in double precision; the test
makes the same. A case this torch cannot run is recorded with the reason."""
import json
import math
import sys

import torch
from torch import nn
from torch.optim import swa_utils

UPDATES = 30
DECAY = 0.9


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(3, 4)
        self.l2 = nn.Linear(4, 2)
        self.register_buffer("running", torch.zeros(4))


def tensors(module):
    return list(module.parameters()) + list(module.buffers())


def set_weights(net, k):
    with torch.no_grad():
        for j, t in enumerate(tensors(net)):
            values = [math.sin(0.37 * k + 0.11 * e + 0.7 * j) * (1 + 0.01 * k) for e in range(t.numel())]
            t.copy_(torch.tensor(values, dtype=torch.float64).reshape(t.shape))


def record(**averaging):
    net = Net().double()
    averaged = swa_utils.AveragedModel(net, use_buffers=True, **averaging)
    rows = []
    for k in range(UPDATES):
        set_weights(net, k)
        averaged.update_parameters(net)
        rows.append([v for t in tensors(averaged.module) for v in t.detach().flatten().tolist()])
    return {"rows": rows}


def main():
    cases = {"swa": record()}
    # Lightning's EMAWeightAveraging uses get_ema_avg_fn; torch 1.13 has
    # none, and its formula is given directly there.
    if hasattr(swa_utils, "get_ema_avg_fn"):
        cases["ema"] = record(avg_fn=swa_utils.get_ema_avg_fn(DECAY))
    else:
        cases["ema"] = record(avg_fn=lambda a, m, n: DECAY * a + (1 - DECAY) * m)
    if hasattr(swa_utils, "get_ema_multi_avg_fn"):
        cases["ema_multi"] = record(multi_avg_fn=swa_utils.get_ema_multi_avg_fn(DECAY))
    else:
        cases["ema_multi"] = {"skipped": f"torch {torch.__version__} has no get_ema_multi_avg_fn"}
    with open(sys.argv[1], "w") as f:
        json.dump({"torch": torch.__version__, "decay": DECAY, "cases": cases}, f)


if __name__ == "__main__":
    main()
