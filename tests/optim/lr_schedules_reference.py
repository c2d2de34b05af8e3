"""Records torch.optim.lr_scheduler's learning rates (and the momentum that
OneCycleLR and CyclicLR cycle) for the cases below, and ReduceLROnPlateau's
for a fixed sequence of metric values, as JSON, for
lr_schedules_test.cpp to compare fulgor's schedules with value by value.

Usage: /usr/bin/python3 lr_schedules_reference.py OUTPUT.json
A case this torch cannot run is recorded with the reason instead."""
import json
import math
import sys

import torch
from torch.optim import lr_scheduler

STEPS = 240

# Factor functions by name, as lr_schedules_test.cpp defines them too.
FACTORS = {
    "pow097": lambda e: 0.97 ** e,
    "warmup10": lambda e: min(1.0, (e + 1) / 10),
    "const098": lambda e: 0.98,
    "slowing": lambda e: 1.0 - 1.0 / (e + 20),
}


def cycling(kind, **args):
    return {"type": kind, "args": args, "momentum": True}


def plain(kind, **args):
    return {"type": kind, "args": args}


CASES = [
    ("LambdaLR", "sgd", [0.1], {"type": "LambdaLR", "factor": "pow097"}),
    ("LambdaLR", "sgd", [0.1, 0.02], {"type": "LambdaLR", "factor": "warmup10"}),
    ("MultiplicativeLR", "sgd", [0.1], {"type": "MultiplicativeLR", "factor": "const098"}),
    ("MultiplicativeLR", "adam", [0.003, 0.3], {"type": "MultiplicativeLR", "factor": "slowing"}),
    ("StepLR", "sgd", [0.1], plain("StepLR", step_size=30, gamma=0.1)),
    ("StepLR", "sgd", [0.5, 0.05], plain("StepLR", step_size=7, gamma=0.9)),
    ("MultiStepLR", "sgd", [0.1], plain("MultiStepLR", milestones=[30, 80, 150], gamma=0.1)),
    ("MultiStepLR", "sgd", [0.1, 0.3], plain("MultiStepLR", milestones=[50, 10, 50, 200], gamma=0.5)),
    ("ConstantLR", "sgd", [0.1], plain("ConstantLR")),
    ("ConstantLR", "sgd", [0.1, 0.7], plain("ConstantLR", factor=0.25, total_iters=100)),
    ("LinearLR", "sgd", [0.1], plain("LinearLR")),
    ("LinearLR", "adam", [0.001, 0.01], plain("LinearLR", start_factor=0.01, end_factor=1.0, total_iters=150)),
    ("LinearLR", "sgd", [0.1], plain("LinearLR", start_factor=1.0, end_factor=0.05, total_iters=200)),
    ("ExponentialLR", "sgd", [0.1], plain("ExponentialLR", gamma=0.99)),
    ("ExponentialLR", "sgd", [0.2, 1.0], plain("ExponentialLR", gamma=0.9)),
    ("PolynomialLR", "sgd", [0.1], plain("PolynomialLR")),
    ("PolynomialLR", "sgd", [0.1, 0.05], plain("PolynomialLR", total_iters=200, power=2.0)),
    ("PolynomialLR", "adam", [0.01], plain("PolynomialLR", total_iters=180, power=0.5)),
    ("CosineAnnealingLR", "sgd", [0.1], plain("CosineAnnealingLR", T_max=50)),
    ("CosineAnnealingLR", "sgd", [0.1, 0.4], plain("CosineAnnealingLR", T_max=100, eta_min=0.001)),
    ("CosineAnnealingLR", "adam", [0.001], plain("CosineAnnealingLR", T_max=240, eta_min=1e-5)),
    ("CosineAnnealingWarmRestarts", "sgd", [0.1], plain("CosineAnnealingWarmRestarts", T_0=10)),
    ("CosineAnnealingWarmRestarts", "sgd", [0.1, 0.2],
     plain("CosineAnnealingWarmRestarts", T_0=5, T_mult=2, eta_min=0.001)),
    ("OneCycleLR", "sgd", [0.1], cycling("OneCycleLR", max_lr=0.1, total_steps=240)),
    ("OneCycleLR", "adam", [0.001, 0.001],
     cycling("OneCycleLR", max_lr=[0.01, 0.05], epochs=6, steps_per_epoch=40, pct_start=0.25,
             anneal_strategy="linear", base_momentum=0.8, max_momentum=0.92, div_factor=10.0,
             final_div_factor=100.0, three_phase=True)),
    ("OneCycleLR", "sgd", [0.1], cycling("OneCycleLR", max_lr=0.3, total_steps=250, three_phase=True)),
    ("OneCycleLR", "sgd", [0.1], plain("OneCycleLR", max_lr=0.2, total_steps=240, cycle_momentum=False)),
    ("CyclicLR", "sgd", [0.1], cycling("CyclicLR", base_lr=0.001, max_lr=0.1, step_size_up=20)),
    ("CyclicLR", "sgd", [0.1, 0.1],
     cycling("CyclicLR", base_lr=[0.001, 0.01], max_lr=[0.1, 0.05], step_size_up=15, step_size_down=35,
             mode="triangular2", base_momentum=0.85, max_momentum=0.95)),
    ("CyclicLR", "sgd", [0.1], cycling("CyclicLR", base_lr=0.01, max_lr=0.2, step_size_up=25, mode="exp_range",
                                       gamma=0.995)),
    ("CyclicLR", "adam", [0.001], cycling("CyclicLR", base_lr=0.0001, max_lr=0.002, step_size_up=30)),
    ("SequentialLR", "sgd", [0.1], {"type": "SequentialLR", "milestones": [20], "schedulers": [
        plain("LinearLR", start_factor=0.01, total_iters=20), plain("CosineAnnealingLR", T_max=220)]}),
    ("SequentialLR", "sgd", [0.1, 0.5], {"type": "SequentialLR", "milestones": [10, 100], "schedulers": [
        plain("ConstantLR", factor=0.1, total_iters=10), plain("ExponentialLR", gamma=0.98),
        plain("StepLR", step_size=25, gamma=0.5)]}),
    ("SequentialLR", "sgd", [0.1], {"type": "SequentialLR", "milestones": [15, 60], "schedulers": [
        {"type": "LambdaLR", "factor": "warmup10"}, {"type": "MultiplicativeLR", "factor": "const098"},
        plain("CosineAnnealingWarmRestarts", T_0=30)]}),
    ("ChainedScheduler", "sgd", [0.1], {"type": "ChainedScheduler", "schedulers": [
        plain("ConstantLR", factor=0.1, total_iters=5), plain("ExponentialLR", gamma=0.99)]}),
    ("ChainedScheduler", "sgd", [0.1, 0.3], {"type": "ChainedScheduler", "schedulers": [
        plain("LinearLR", start_factor=0.1, total_iters=30), plain("CosineAnnealingLR", T_max=120, eta_min=0.001),
        plain("MultiStepLR", milestones=[100, 200], gamma=0.5)]}),
]

# ReduceLROnPlateau, stepped with plateau_metric(mode, step).
PLATEAU_CASES = [
    ("sgd", [0.1], dict(mode="min", factor=0.5, patience=3, threshold=0.01, threshold_mode="abs")),
    ("sgd", [0.1, 0.02], dict(mode="max", factor=0.3, patience=2, threshold=0.005, threshold_mode="abs", cooldown=2)),
    ("adam", [0.01], dict(mode="min", factor=0.5, patience=1, threshold=0.0, eps=1e-3)),
    ("sgd", [0.1], dict(mode="min", factor=0.2, patience=4, threshold=0.05, min_lr=0.0005)),
    ("sgd", [0.1], dict(mode="max", factor=0.5, patience=2, threshold=0.02, cooldown=1)),
]


def plateau_metric(mode, step):
    value = 1 / (1 + 0.05 * step) + 0.02 * math.sin(0.9 * step)
    return value if mode == "min" else -value


def make(spec, optimizer):
    kind = spec["type"]
    if kind in ("SequentialLR", "ChainedScheduler"):
        parts = [make(s, optimizer) for s in spec["schedulers"]]
        if kind == "SequentialLR":
            return lr_scheduler.SequentialLR(optimizer, parts, milestones=spec["milestones"])
        return lr_scheduler.ChainedScheduler(parts)
    if "factor" in spec:
        return getattr(lr_scheduler, kind)(optimizer, FACTORS[spec["factor"]])
    return getattr(lr_scheduler, kind)(optimizer, **spec["args"])


def momenta(optimizer):
    return [g["betas"][0] if "betas" in g else g["momentum"] for g in optimizer.param_groups]


def make_optimizer(optimizer_kind, lrs):
    groups = [{"params": [torch.zeros(1, requires_grad=True)], "lr": lr} for lr in lrs]
    if optimizer_kind == "sgd":
        return torch.optim.SGD(groups, lr=lrs[0], momentum=0.9)
    return torch.optim.Adam(groups, lr=lrs[0])


def record_plateau(optimizer_kind, lrs, args):
    optimizer = make_optimizer(optimizer_kind, lrs)
    scheduler = lr_scheduler.ReduceLROnPlateau(optimizer, **args)
    out = {"lrs": [[g["lr"] for g in optimizer.param_groups]]}
    for step in range(1, STEPS + 1):
        optimizer.step()
        scheduler.step(plateau_metric(args["mode"], step))
        out["lrs"].append([g["lr"] for g in optimizer.param_groups])
    return out


def record(optimizer_kind, lrs, spec):
    optimizer = make_optimizer(optimizer_kind, lrs)
    scheduler = make(spec, optimizer)
    out = {"lrs": [], "momenta": []}
    for step in range(STEPS + 1):
        if step > 0:
            optimizer.step()
            scheduler.step()
        out["lrs"].append([g["lr"] for g in optimizer.param_groups])
        out["momenta"].append(momenta(optimizer))
    return out


def main():
    cases = []
    for schedule, optimizer_kind, lrs, spec in CASES:
        case = {"schedule": schedule, "optimizer": optimizer_kind, "group_lrs": lrs, "spec": spec}
        try:
            case.update(record(optimizer_kind, lrs, spec))
        except (ValueError, TypeError) as e:
            case["skipped"] = f"torch {torch.__version__} refuses it: {e}"
        cases.append(case)
    plateau = []
    for optimizer_kind, lrs, args in PLATEAU_CASES:
        case = {"optimizer": optimizer_kind, "group_lrs": lrs, "args": args}
        case.update(record_plateau(optimizer_kind, lrs, args))
        plateau.append(case)
    with open(sys.argv[1], "w") as f:
        json.dump({"torch": torch.__version__, "steps": STEPS, "cases": cases, "plateau_cases": plateau}, f)


if __name__ == "__main__":
    main()
