"""Checks a Lightning .ckpt fulgor wrote as Lightning 2.6 reads it, then
takes the next training step in Python from it.

  lightning_export.py check CKPT DATA CASE OUT
      loads CKPT (torch.load with weights_only=True; on torch 1.x, whose
      weights-only reader has no float opcode, checks that a float is all it
      refuses and loads it with weights_only=False), checks the keys and
      types that Lightning's load_from_checkpoint and fit(ckpt_path=...)
      read, builds LitNet(**hyper_parameters) and loads "state_dict"
      strictly, loads "optimizer_states"[0] and "lr_schedulers" into the
      optimizer and scheduler of CASE (optim_resume.py's), takes one step on
      DATA's batch after global_step (optim_resume.py's batches), and saves
      the network's state dict to OUT

Run with Debian's python3, which has python3-torch.
"""

import os
import pickle
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import optim_resume  # noqa: E402


class LitNet(torch.nn.Module):
    """A LightningModule's shape: the network under `model`, its
    constructor's keyword arguments saved as hyper_parameters."""

    def __init__(self, hidden, label):
        super().__init__()
        assert hidden == 8 and label == "fulgor", (hidden, label)
        self.model = optim_resume.Net()


def load(path):
    if int(torch.__version__.split(".")[0]) >= 2:
        return torch.load(path, weights_only=True)
    try:
        torch.load(path, weights_only=True)
        sys.exit("torch 1.x's weights-only reader took floats")
    except pickle.UnpicklingError as e:
        if "Unsupported operand 71" not in str(e):  # 71: BINFLOAT
            raise
    return torch.load(path)


def check_keys(ckpt):
    """What Lightning 2.6 reads: checkpoint_connector.py's restore_model,
    restore_optimizers_and_schedulers and restore_loops, saving.py's
    _load_state."""
    types = {"epoch": int, "global_step": int, "pytorch-lightning_version": str, "state_dict": dict,
             "optimizer_states": list, "lr_schedulers": list, "hyper_parameters": dict, "hparams_name": str}
    for key, kind in types.items():
        if not isinstance(ckpt.get(key), kind):
            sys.exit(f"{key} is {type(ckpt.get(key)).__name__}, not {kind.__name__}")
    for key in ("loops", "callbacks"):
        if key in ckpt:
            sys.exit(f"{key} is written; fulgor leaves it out")
    if not all(isinstance(v, torch.Tensor) for v in ckpt["state_dict"].values()):
        sys.exit("state_dict holds a value that is not a tensor")


def check(path, data_path, case, out):
    ckpt = load(path)
    check_keys(ckpt)
    model = LitNet(**ckpt["hyper_parameters"])
    model.load_state_dict(ckpt["state_dict"], strict=True)
    make_optimizer, make_scheduler, _ = optim_resume.CASES[case]
    optimizer = make_optimizer(model.parameters())
    # Hyper-parameters that are not fulgor's: load_state_dict must bring them.
    for group in optimizer.param_groups:
        group["lr"] = 123.0
    optimizer.load_state_dict(ckpt["optimizer_states"][0])
    scheduler = make_scheduler(optimizer) if make_scheduler else None
    if len(ckpt["lr_schedulers"]) != (1 if scheduler else 0):
        sys.exit(f"{len(ckpt['lr_schedulers'])} scheduler states")
    if scheduler is not None:
        scheduler.load_state_dict(ckpt["lr_schedulers"][0])
    data = torch.load(data_path)
    optim_resume.train(model.model, optimizer, scheduler, data, ckpt["global_step"], 1)
    torch.save(model.model.state_dict(), out)
    print(f"torch {torch.__version__}: {case} stepped from global_step {ckpt['global_step']}, "
          f"lr {optimizer.param_groups[0]['lr']}")


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "check":
        check(*sys.argv[2:])
    else:
        sys.exit(__doc__)
