"""Runs begun in Python, for fulgor to continue: torch.optim's SGD, Adam and
AdamW trained N steps, saved as Lightning or {model, optimizer} checkpoints,
then continued M steps in Python, whose weights fulgor must reach.

  optim_resume.py write DIR   writes DIR/resume_data.pt (the batches),
                              DIR/resume_<case>.{ckpt,pt} and
                              DIR/resume_<case>_after.pt (the weights after
                              M more steps), and DIR/resume.json

Run with Debian's python3, which has python3-torch.
"""

import collections
import json
import os
import sys

import torch

BATCH, BATCHES_PER_EPOCH, N, M = 8, 4, 6, 5


class Net(torch.nn.Module):
    """The network of tests/interop/optimizer_state_test.cpp: its state dict
    keys (net.0.weight, ...) are the fulgor Module's."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))

    def forward(self, x):
        return self.net(x)


# case: (optimizer, scheduler or None, Lightning's checkpoint or a plain one)
CASES = {
    "sgd": (lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
            lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=4, gamma=0.5), "lightning"),
    "sgd_nesterov": (lambda p: torch.optim.SGD(p, lr=0.03, momentum=0.8, nesterov=True), None, "plain"),
    "adam": (lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.8, 0.99), weight_decay=0.01, amsgrad=True), None,
             "lightning"),
    "adamw": (lambda p: torch.optim.AdamW(p, lr=0.02, weight_decay=0.1), None, "plain"),
}


def batches(data):
    for i in range(BATCHES_PER_EPOCH):
        yield data["x"][i * BATCH:(i + 1) * BATCH], data["y"][i * BATCH:(i + 1) * BATCH]


def train(model, optimizer, scheduler, data, start, steps):
    """`steps` steps from batch number `start` of the epoch, as fulgor's
    Trainer takes them: zero the grads, the loss, backward, step, then a
    scheduler of interval "step"."""
    order = list(batches(data))
    for k in range(start, start + steps):
        x, y = order[k % BATCHES_PER_EPOCH]
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()


def progress(ready, started, processed, completed):
    counts = {"ready": ready, "started": started, "processed": processed, "completed": completed}
    return {"total": dict(counts), "current": dict(counts)}


def lightning_checkpoint(model, optimizer, scheduler):
    """What Lightning's dump_checkpoint writes when a ModelCheckpoint saves
    after batch N (mid-epoch: N is not a multiple of the epoch's batches)."""
    epoch, in_epoch = divmod(N, BATCHES_PER_EPOCH)
    batch = progress(in_epoch, in_epoch, in_epoch, in_epoch - 1)
    batch["total"] = {"ready": N, "started": N, "processed": N, "completed": N - 1}
    batch["is_last_batch"] = False
    fit_loop = {
        "state_dict": {},
        "epoch_loop.state_dict": {"_batches_that_stepped": N},
        "epoch_loop.batch_progress": batch,
        "epoch_progress": progress(epoch + 1, epoch + 1, epoch, epoch),
    }
    return {
        "epoch": epoch,
        "global_step": N,
        "pytorch-lightning_version": "2.6.5",
        "state_dict": model.state_dict(),
        "loops": {"fit_loop": fit_loop},
        "callbacks": {},
        "optimizer_states": [optimizer.state_dict()],
        "lr_schedulers": [scheduler.state_dict()] if scheduler is not None else [],
        "hparams_name": "kwargs",
        "hyper_parameters": {"hidden": 8},
    }


def write_case(directory, name, data, report):
    make_optimizer, make_scheduler, kind = CASES[name]
    torch.manual_seed(3)
    model = Net()
    optimizer = make_optimizer(model.parameters())
    scheduler = make_scheduler(optimizer) if make_scheduler else None
    train(model, optimizer, scheduler, data, 0, N)
    if kind == "lightning":
        path = os.path.join(directory, f"resume_{name}.ckpt")
        torch.save(lightning_checkpoint(model, optimizer, scheduler), path)
        start = N  # Lightning resumes where it stopped
    else:
        path = os.path.join(directory, f"resume_{name}.pt")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
        start = 0  # a fit without counters begins at the data's start
    # Continue from the file, as a new process would.
    loaded = torch.load(path)
    resumed = Net()
    resumed.load_state_dict(loaded["state_dict"] if kind == "lightning" else loaded["model"])
    optimizer = make_optimizer(resumed.parameters())
    optimizer.load_state_dict(loaded["optimizer_states"][0] if kind == "lightning" else loaded["optimizer"])
    scheduler = make_scheduler(optimizer) if make_scheduler else None
    if scheduler is not None:
        scheduler.load_state_dict(loaded["lr_schedulers"][0])
    train(resumed, optimizer, scheduler, data, start, M)
    torch.save(resumed.state_dict(), os.path.join(directory, f"resume_{name}_after.pt"))
    report[name] = {"file": os.path.basename(path), "lightning": kind == "lightning", "start": start,
                    "lr_after": optimizer.param_groups[0]["lr"]}


def write(directory):
    os.makedirs(directory, exist_ok=True)
    torch.manual_seed(1)
    x = torch.randn(BATCH * BATCHES_PER_EPOCH, 4)
    data = {"x": x, "y": torch.stack([x.sum(1).sin(), x[:, 0] * x[:, 1]], 1)}
    torch.save(data, os.path.join(directory, "resume_data.pt"))
    report = {"batch_size": BATCH, "n": N, "m": M, "torch": torch.__version__, "cases": {}}
    for name in CASES:
        write_case(directory, name, data, report["cases"])
    with open(os.path.join(directory, "resume.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "write":
        write(sys.argv[2])
    else:
        sys.exit(__doc__)
