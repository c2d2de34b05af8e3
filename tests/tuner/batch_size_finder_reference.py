"""Lightning 2.6.5's batch-size search, against a model that runs out of memory.

Usage: python3 batch_size_finder_reference.py IN.json OUT.json

IN.json has "cases": the finder's options, the largest batch that fits
("limit") and the data set's length. _run_power_scaling,
_run_binsearch_scaling and the part of _adjust_batch_size that decides the
next size are Lightning's (src/lightning/pytorch/tuner/batch_size_scaling.py),
with the Trainer replaced by a stand-in that records the sizes tried: a trial
raises CUDA's out-of-memory RuntimeError above the limit, as a device would.
OUT.json has, for each case, the trials ([size, fitted]) and the size found.
"""

import json
import sys


class _Trainer:
    def __init__(self, case):
        self.batch_size = case["start"]
        self.limit = case["limit"]
        self.dataset_length = case["dataset_length"]
        self.trials = []


def garbage_collection_cuda():
    pass


def rank_zero_info(message):
    pass


def is_oom_error(exception):
    return "CUDA" in exception.args[0] and "out of memory" in exception.args[0]


def lightning_setattr(trainer, name, value):
    trainer.batch_size = value


def _reset_progress(trainer):
    pass


def _reset_dataloaders(trainer):
    pass


def _try_loop_run(trainer, params):
    size = trainer.batch_size
    if size > trainer.limit:
        trainer.trials.append([size, False])
        raise RuntimeError("CUDA out of memory. Tried to allocate a batch of %d" % size)
    trainer.trials.append([size, True])


def _adjust_batch_size(trainer, batch_arg_name="batch_size", factor=1.0, value=None, desc=None, max_val=8192):
    batch_size = trainer.batch_size
    combined_dataset_length = trainer.dataset_length
    if batch_size >= combined_dataset_length:
        rank_zero_info(f"The batch size {batch_size} is greater or equal than the length of your dataset.")
        return batch_size, False

    new_size = value if value is not None else int(batch_size * factor)

    # Apply max_val limit if provided
    if new_size > max_val:
        if desc:
            rank_zero_info(f"Batch size {new_size} exceeds max_val limit {max_val}, capping at {max_val}")
        new_size = max_val

    if desc:
        rank_zero_info(f"Batch size {batch_size} {desc}, trying batch size {new_size}")
    changed = new_size != batch_size
    lightning_setattr(trainer, batch_arg_name, new_size)
    return new_size, changed


def _run_power_scaling(trainer, new_size, batch_arg_name, max_trials, params, max_val=8192):
    any_success = False
    last_successful_size = new_size
    for i in range(max_trials):
        garbage_collection_cuda()
        _reset_progress(trainer)
        if new_size >= max_val:
            rank_zero_info(f"Reached the maximum batch size limit of {max_val}. Stopping search.")
            break
        try:
            _try_loop_run(trainer, params)
            last_successful_size = new_size
            if i + 1 >= max_trials:
                new_size = last_successful_size
                break
            new_size, changed = _adjust_batch_size(trainer, batch_arg_name, factor=2.0, desc="succeeded")
            if not changed:
                break
            _reset_dataloaders(trainer)
            any_success = True
        except RuntimeError as exception:
            if is_oom_error(exception):
                garbage_collection_cuda()
                new_size, _ = _adjust_batch_size(trainer, batch_arg_name, factor=0.5, desc="failed")
                _reset_dataloaders(trainer)
                if any_success:
                    break
            else:
                raise
    return new_size


def _run_binsearch_scaling(trainer, new_size, batch_arg_name, max_trials, params, margin, max_val=8192):
    low = 1
    high = None
    count = 0
    last_successful_size = new_size
    while True:
        garbage_collection_cuda()
        _reset_progress(trainer)
        if new_size >= max_val:
            rank_zero_info(f"Reached the maximum batch size limit of {max_val}. Stopping search.")
            break
        try:
            _try_loop_run(trainer, params)
            last_successful_size = new_size
            count += 1
            if count >= max_trials:
                new_size = last_successful_size
                break
            low = new_size
            if high:
                if high - low <= 1:
                    break
                midval = (high + low) // 2
                new_size, changed = _adjust_batch_size(
                    trainer, batch_arg_name, value=midval, desc="succeeded", max_val=max_val
                )
            else:
                new_size, changed = _adjust_batch_size(
                    trainer, batch_arg_name, factor=2.0, desc="succeeded", max_val=max_val
                )
            if not changed:
                break
            _reset_dataloaders(trainer)
        except RuntimeError as exception:
            if is_oom_error(exception):
                garbage_collection_cuda()
                high = new_size
                midval = (high + low) // 2
                new_size, _ = _adjust_batch_size(trainer, batch_arg_name, value=midval, desc="failed")
                _reset_dataloaders(trainer)
                if high - low <= 1:
                    break
            else:
                raise
    if margin > 0:
        margin_reduced_size = max(1, int(new_size * (1 - margin)))
        if margin_reduced_size != new_size:
            new_size = margin_reduced_size
            lightning_setattr(trainer, batch_arg_name, new_size)
    return new_size


def search(case):
    """_scale_batch_size, from its first _adjust_batch_size on."""
    trainer = _Trainer(case)
    new_size, _ = _adjust_batch_size(trainer, "batch_size", value=case["init_val"])
    if case["mode"] == "power":
        new_size = _run_power_scaling(trainer, new_size, "batch_size", case["max_trials"], {}, case["max_val"])
    else:
        new_size = _run_binsearch_scaling(
            trainer, new_size, "batch_size", case["max_trials"], {}, case["margin"], case["max_val"]
        )
    return {"trials": trainer.trials, "found": new_size, "attribute": trainer.batch_size}


def main():
    with open(sys.argv[1]) as f:
        request = json.load(f)
    with open(sys.argv[2], "w") as f:
        json.dump({"cases": [search(case) for case in request["cases"]]}, f)


if __name__ == "__main__":
    main()
