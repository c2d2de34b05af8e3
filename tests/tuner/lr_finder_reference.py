"""Lightning 2.6.5's learning-rate finder, on the losses a fulgor sweep saw.

Usage: python3 lr_finder_reference.py IN.json OUT.json

IN.json has "sweeps": each the finder's options and the raw training_step
losses of the steps fulgor took, and "curves": recorded (lr, loss) lists with
skip_begin/skip_end. For each sweep this replays Lightning's sweep: the
rates its _ExponentialLR/_LinearLR scheduler gives (on a torch optimizer,
as _exchange_scheduler sets it up), the smoothed losses and the early stop of
_LRCallback, and the suggestion of _LRFinder.suggestion; for each curve, the
suggestion's index. The classes and functions below are Lightning's
(src/lightning/pytorch/tuner/lr_finder.py), with its decorators and logging
left out.
"""

import json
import sys

import torch

try:
    from torch.optim.lr_scheduler import LRScheduler
except ImportError:  # torch 1.13 names it _LRScheduler
    from torch.optim.lr_scheduler import _LRScheduler as LRScheduler


class _LinearLR(LRScheduler):
    def __init__(self, optimizer, end_lr, num_iter, last_epoch=-1):
        self.end_lr = end_lr
        self.num_iter = num_iter
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        curr_iter = self.last_epoch + 1
        r = curr_iter / self.num_iter

        if self.last_epoch > 0:
            val = [base_lr + r * (self.end_lr - base_lr) for base_lr in self.base_lrs]
        else:
            val = list(self.base_lrs)
        self._lr = val
        return val

    @property
    def lr(self):
        return self._lr


class _ExponentialLR(LRScheduler):
    def __init__(self, optimizer, end_lr, num_iter, last_epoch=-1):
        self.end_lr = end_lr
        self.num_iter = num_iter
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        curr_iter = self.last_epoch + 1
        r = curr_iter / self.num_iter

        if self.last_epoch > 0:
            val = [base_lr * (self.end_lr / base_lr) ** r for base_lr in self.base_lrs]
        else:
            val = list(self.base_lrs)
        self._lr = val
        return val

    @property
    def lr(self):
        return self._lr


def suggestion_index(results, skip_begin=10, skip_end=1):
    """_LRFinder.suggestion, returning _optimal_idx."""
    losses = torch.tensor(results["loss"][skip_begin:-skip_end])
    lrs = torch.tensor(results["lr"][skip_begin:-skip_end])
    is_finite = torch.isfinite(losses)
    losses = losses[is_finite]
    lrs = lrs[is_finite]

    if len(losses) < 2:
        return None

    gradients = torch.gradient(losses, spacing=[lrs])[0]
    min_grad = torch.argmin(gradients).item()
    all_losses_idx = torch.arange(len(results["loss"]))
    idx_non_skipped = all_losses_idx[skip_begin:-skip_end]
    idx_finite = idx_non_skipped[is_finite]
    return idx_finite[min_grad].item()


class _LRCallbackArithmetic:
    """_LRCallback.on_train_batch_end's smoothing and stop rule."""

    def __init__(self, early_stop_threshold, beta=0.98):
        self.early_stop_threshold = early_stop_threshold
        self.beta = beta
        self.losses = []
        self.avg_loss = 0.0
        self.best_loss = 0.0

    def on_train_batch_end(self, current_loss, current_step):
        should_stop = False
        self.avg_loss = self.beta * self.avg_loss + (1 - self.beta) * current_loss
        smoothed_loss = self.avg_loss / (1 - self.beta ** (current_step + 1))
        if (
            self.early_stop_threshold is not None
            and current_step > 1
            and smoothed_loss > self.early_stop_threshold * self.best_loss
        ):
            should_stop = True
        if smoothed_loss < self.best_loss or current_step == 1:
            self.best_loss = smoothed_loss
        self.losses.append(smoothed_loss)
        return should_stop


def sweep(case):
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.1)
    # _LRFinder._exchange_scheduler
    for group in optimizer.param_groups:
        group["lr"] = case["min_lr"]
        group["initial_lr"] = case["min_lr"]
    args = (optimizer, case["max_lr"], case["num_training"])
    scheduler = _LinearLR(*args) if case["mode"] == "linear" else _ExponentialLR(*args)
    callback = _LRCallbackArithmetic(case["early_stop_threshold"])
    lrs = []
    global_step = case["start_step"]
    for raw_loss in case["raw_losses"]:
        lrs.append(scheduler.lr[0])  # on_train_batch_start
        optimizer.step()
        global_step += 1
        scheduler.step()
        stop = callback.on_train_batch_end(raw_loss, global_step)
        if stop or global_step - case["start_step"] == case["num_training"]:
            break
    results = {"lr": lrs, "loss": callback.losses}
    return {"lr": lrs, "loss": callback.losses, "optimal_idx": suggestion_index(results)}


def main():
    with open(sys.argv[1]) as f:
        request = json.load(f)
    out = {
        "torch_version": torch.__version__,
        "sweeps": [sweep(case) for case in request["sweeps"]],
        "curves": [
            # JSON has no NaN or infinity: the test writes them as "nan" and "inf".
            suggestion_index({"lr": c["lr"], "loss": [float(v) for v in c["loss"]]}, c["skip_begin"], c["skip_end"])
            for c in request["curves"]
        ],
    }
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
