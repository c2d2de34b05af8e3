# torch.optim's foreach and fused steps, for tests/optim/step_kernels_test.cpp:
# each case's parameters and state after six steps on step_kernels_test.cpp's
# gradients, as JSON. fused runs where this torch has CPU kernels for it.
import json
import math
import sys

import torch

CASES = {
    "adam": (torch.optim.Adam, dict(lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)),
    "adam_amsgrad": (torch.optim.Adam, dict(lr=0.01, amsgrad=True)),
    "adamw": (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.05, amsgrad=True)),
    "sgd": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    "sgd_nesterov": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True)),
    "sgd_plain": (torch.optim.SGD, dict(lr=0.1)),
}
SHAPES = [(3, 4), (5,)]
STEPS = 6


def params():
    return [torch.cos(torch.arange(math.prod(s), dtype=torch.float64) * 0.11).reshape(s).requires_grad_()
            for s in SHAPES]


def gradient(p, k):
    index = torch.arange(p.numel(), dtype=torch.float64).reshape(p.shape)
    return p.detach() * 0.3 + torch.sin(index * 0.37 + k)


def run(kind, options, implementation):
    ps = params()
    opt = kind(ps, **options, **implementation)
    for k in range(STEPS):
        for p in ps:
            p.grad = gradient(p, k)
        opt.step()
    state = [{key: v.flatten().tolist() for key, v in opt.state[p].items()
              if torch.is_tensor(v) and key != "step"} for p in ps]
    return {"params": [p.detach().flatten().tolist() for p in ps], "state": state}


def has_cpu_fused(kind):
    try:
        p = torch.zeros(1, dtype=torch.float64, requires_grad=True)
        p.grad = torch.ones(1, dtype=torch.float64)
        kind([p], lr=0.1, fused=True).step()
        return True
    except (RuntimeError, TypeError, ValueError):
        return False


out = {"torch": torch.__version__}
for name, (kind, options) in CASES.items():
    out[name] = {"foreach": run(kind, options, {"foreach": True})}
    if has_cpu_fused(kind):
        out[name]["fused"] = run(kind, options, {"fused": True})
json.dump(out, open(sys.argv[1], "w"))
