"""Records torch.optim.swa_utils' SWALR rates and update_bn's statistics, as
JSON, for stochastic_weight_averaging_test.cpp to compare fulgor's with.

Usage: /usr/bin/python3 swa_reference.py OUTPUT.json
SWALR: each case's rates after construction and after each of STEPS steps;
the "lightning" cases build it as Lightning's StochasticWeightAveraging does
(group["initial_lr"] = swa_lr, last_epoch = max_epochs for "cos").
update_bn: Net's weights are sin(0.37 j + 0.11 e) for tensor j, element e;
batch b's input row r, column c is 2 cos(0.3 b + 0.7 r + 1.1 c) + 0.5; the
test makes the same."""
import json
import math
import sys
import warnings

import torch
from torch import nn
from torch.optim import swa_utils

STEPS = 14
MAX_EPOCHS = 10


def swalr_case(group_lrs, swa_lrs, anneal_epochs, strategy, lightning):
    params = [nn.Parameter(torch.zeros(1)) for _ in group_lrs]
    optimizer = torch.optim.SGD([{"params": [p], "lr": lr} for p, lr in zip(params, group_lrs)], lr=group_lrs[0])
    swa_lr = swa_lrs if len(swa_lrs) > 1 else swa_lrs[0]
    last_epoch = -1
    if lightning:
        for lr, group in zip(swa_lrs * len(group_lrs) if len(swa_lrs) == 1 else swa_lrs, optimizer.param_groups):
            group["initial_lr"] = lr
        last_epoch = MAX_EPOCHS if strategy == "cos" else -1
    scheduler = swa_utils.SWALR(optimizer, swa_lr=swa_lr, anneal_epochs=anneal_epochs,
                                anneal_strategy=strategy, last_epoch=last_epoch)
    rows = [[g["lr"] for g in optimizer.param_groups]]
    for _ in range(STEPS):
        optimizer.step()
        scheduler.step()
        rows.append([g["lr"] for g in optimizer.param_groups])
    return {"group_lrs": group_lrs, "swa_lrs": swa_lrs, "anneal_epochs": anneal_epochs, "strategy": strategy,
            "lightning": lightning, "lrs": rows}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(3, 4)
        self.bn1 = nn.BatchNorm1d(4, momentum=0.3)
        self.l2 = nn.Linear(4, 2)
        self.bn2 = nn.BatchNorm1d(2)

    def forward(self, x):
        return self.bn2(self.l2(torch.relu(self.bn1(self.l1(x)))))


def batch(b, rows):
    return torch.tensor([[2 * math.cos(0.3 * b + 0.7 * r + 1.1 * c) + 0.5 for c in range(3)] for r in range(rows)],
                        dtype=torch.float64).float()


def update_bn_case():
    net = Net()
    with torch.no_grad():
        for j, p in enumerate(net.parameters()):
            values = [math.sin(0.37 * j + 0.11 * e) for e in range(p.numel())]
            p.copy_(torch.tensor(values, dtype=torch.float64).reshape(p.shape))
        for bn in (net.bn1, net.bn2):
            bn.running_mean.fill_(7.0)
            bn.running_var.fill_(3.0)
            bn.num_batches_tracked.fill_(11)
    net.eval()
    loader = [batch(b, rows) for b, rows in enumerate([5, 4, 3])]
    swa_utils.update_bn(loader, net)
    return {
        "training": net.training,
        "momenta": [net.bn1.momentum, net.bn2.momentum],
        "bn": [{"running_mean": bn.running_mean.double().tolist(), "running_var": bn.running_var.double().tolist(),
                "num_batches_tracked": int(bn.num_batches_tracked)} for bn in (net.bn1, net.bn2)],
    }


def main():
    warnings.simplefilter("ignore")
    cases = {
        "cos_two_groups": swalr_case([0.1, 0.3], [0.05, 0.02], 3, "cos", False),
        "linear": swalr_case([0.1], [0.01], 4, "linear", False),
        "no_annealing": swalr_case([0.2, 0.1], [0.05], 0, "cos", False),
        "lightning_cos": swalr_case([0.1], [0.05], 2, "cos", True),
        "lightning_linear": swalr_case([0.1], [0.05], 2, "linear", True),
    }
    json.dump({"torch": torch.__version__, "swalr": cases, "update_bn": update_bn_case()},
              open(sys.argv[1], "w"))


main()
