"""Reference distributed checkpoints (torch.distributed.checkpoint, DCP) for
fulgor's reader and writer, made by PyTorch.

  distributed_checkpoint.py write DIR
      writes, with the DCP of the running torch:
        DIR/dcp_one/        STATE saved by one process, no process group
        DIR/dcp_two/        STATE saved by 2 ranks (gloo): every tensor of
                            "model" and every exp_avg and exp_avg_sq of
                            "optim" is a DTensor sharded Shard(0), so
                            .metadata holds 2 chunks of it, uneven (dim 0
                            of 3 is 2 + 1, of 1 is 1 + 0); "step" tensors
                            and other values are replicated
        DIR/dcp_expected.pt torch.save of STATE, plain tensors: the global
                            values of both folders, bit for bit
        DIR/dcp_continued.pt
                            the network's state_dict after CONTINUE
      and reads both folders back (check) before it ends
  distributed_checkpoint.py check FOLDER EXPECTED
      FOLDER (written by fulgor): loads it with DCP's load into a state
      shaped like EXPECTED's (a torch.save'd nested dict), every tensor
      filled with 7 and every other value replaced first, and compares
      every tensor (dtype, shape, bytes) and every other value (type and
      ==); then converts it with dcp_to_torch_save and compares that
      with EXPECTED whose dict keys are made strings (DCP's paths keep no
      key types). Prints each difference and exits 1; exits 0 with one
      line when all agree
  distributed_checkpoint.py lightning DIR
      writes DIR/lightning_sharded.ckpt/ as Lightning 2.6.5's
      FSDPStrategy(state_dict_type="sharded").save_checkpoint does at 2
      ranks, with torch's own functions (Lightning is not needed): a DCP
      folder holding {"model": the FSDP module's SHARDED_STATE_DICT,
      "optimizer_0": FSDP.optim_state_dict} (ShardedTensors split as
      dcp_two's, except that rank 1 holds no shard of a dim-0 size 1) and
      meta.pt,
      torch.save of the rest of the Trainer's checkpoint dict; and
      DIR/lightning_expected.pt, torch.save of the DCP folder's state as
      plain tensors (the same values as STATE, keyed as Lightning keys them)

STATE is {"model": NET.state_dict(), "optim": Adam.state_dict(), "extra":
{"epoch": 3, "global_step": 12, "name": "run", "lrs": [0.1, 0.01]}} where
  NET   = Sequential(Linear(5, 3), LayerNorm(3), Linear(3, 1)) built after
          torch.manual_seed(3), then .double() (keys 0.weight ... 2.bias)
  Adam  = torch.optim.Adam(NET.parameters(), lr=0.01, betas=(0.9, 0.99)),
          after 3 STEPs on x = torch.randn(8, 5, dtype=torch.float64,
          generator=torch.Generator().manual_seed(5)), y = torch.randn(8, 1,
          float64, generator seeded 6)
  STEP  = Adam.zero_grad(); mse_loss(NET(x), y).backward() (the mean over
          the 8 rows); Adam.step()
CONTINUE is 5 more STEPs from STATE, each on the same batch x =
torch.randn(8, 5, float64, generator seeded 7), y = torch.randn(8, 1,
float64, generator seeded 8). torch 1.13 and 2.6 train STATE to values that
differ in their last bits: compare a folder with the expected files of the
same run.

Run with Debian's python3, which has python3-torch; exit status 77 says
that this torch cannot do what was asked at all (with the reason).
torch 2.x: all of the above. torch 1.13 (Debian 12) has the prototype
torch.distributed._shard.checkpoint, which does not flatten nested states,
names its classes in other modules and has no dcp_to_torch_save; its
torch.distributed._shard does not even import on Python 3.11 (see
prototype_dcp, which mends that). There `write` saves STATE flattened by
hand with 2.x's rules and keys (1.13's layout: no planner_data, one file per
item, as its FileSystemWriter does by default), dcp_two with ShardedTensors
split as above (rank 1 holds no shard of a dim-0 size 1; rank 0 writes every
replicated value); `check` compares what load_state_dict loads into that
flat state, and exits 77 on a folder of 2.x's layout; `lightning` exits 77.
"""

import collections
import copy
import os
import shutil
import socket
import sys
import tempfile
import traceback
import warnings

import torch
import torch.distributed as dist

V2 = int(torch.__version__.split(".")[0]) >= 2
CANNOT = 77  # this torch cannot do what was asked at all
WORLD = 2
EXTRA = {"epoch": 3, "global_step": 12, "name": "run", "lrs": [0.1, 0.01]}


def prototype_dcp():
    """torch 1.13's DCP. Its torch.distributed._shard does not import on
    Python 3.11 (Debian 12's): a dataclass field defaults to a
    TensorProperties(), which 3.11 refuses as a mutable default. torch 2.0
    made that default a default_factory; so does this import, for the one
    refused field, and nothing else changes."""
    import dataclasses

    original = dataclasses._get_field

    def get_field(cls, name, *args):
        try:
            return original(cls, name, *args)
        except ValueError:
            declared = cls.__dict__.get(name)
            if not isinstance(declared, dataclasses.Field) or not dataclasses.is_dataclass(declared.default):
                raise
            value, declared.default = declared.default, dataclasses.MISSING
            declared.default_factory = lambda: copy.copy(value)
            return original(cls, name, *args)

    dataclasses._get_field = get_field
    try:
        import torch.distributed._shard.checkpoint as module
    finally:
        dataclasses._get_field = original
    return module


if V2:
    import torch.distributed.checkpoint as dcp
else:
    dcp = prototype_dcp()


def network():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.LayerNorm(3), torch.nn.Linear(3, 1)).double()


def batch(seed_x, seed_y):
    x = torch.randn(8, 5, generator=torch.Generator().manual_seed(seed_x), dtype=torch.float64)
    y = torch.randn(8, 1, generator=torch.Generator().manual_seed(seed_y), dtype=torch.float64)
    return x, y


def train(net, optimizer, data, steps):
    x, y = data
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        optimizer.step()


def trained():
    """NET and its Adam after 3 steps: STATE's objects."""
    net = network()
    optimizer = torch.optim.Adam(net.parameters(), lr=0.01, betas=(0.9, 0.99))
    train(net, optimizer, batch(5, 6), 3)
    return net, optimizer


def detached(obj):
    """A copy of a nested state whose tensors own their storage."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        out = obj.__class__((k, detached(v)) for k, v in obj.items())
        if hasattr(obj, "_metadata"):
            out._metadata = copy.deepcopy(obj._metadata)
        return out
    if isinstance(obj, list):
        return [detached(v) for v in obj]
    return copy.deepcopy(obj)


def state_of(net, optimizer):
    return detached({"model": net.state_dict(), "optim": optimizer.state_dict(), "extra": EXTRA})


# What DCP does with a nested state (2.x's _traverse.traverse_state_dict):
# dicts are walked, their keys made strings; a list is walked when it holds
# a tensor, a dict or such a list, and is one value otherwise; tuples and
# everything else are one value.
def walked(value):
    if isinstance(value, dict):
        return True
    if not isinstance(value, list):
        return False
    return any(isinstance(v, (torch.Tensor, dict)) or walked(v) for v in value)


def flatten(state, path=()):
    """[(path, value)] of a nested state's values, in DCP's order."""
    out = []
    for key, value in (state.items() if isinstance(state, dict) else enumerate(state)):
        here = path + ((str(key) if isinstance(state, dict) else key),)
        out += flatten(value, here) if walked(value) else [(here, value)]
    return out


def flat_state(state):
    """The flat state 1.13's DCP saves and loads: 2.x's keys, the paths
    joined with "."."""
    return collections.OrderedDict((".".join(map(str, p)), v) for p, v in flatten(state))


class NotLoaded:
    def __repr__(self):
        return "<not loaded>"


def blank(obj):
    """A state shaped like `obj` that loading must fill: tensors full of 7,
    other values a NotLoaded."""
    if isinstance(obj, torch.Tensor):
        return torch.full_like(obj, 7) if obj.dtype != torch.bool else ~obj
    if isinstance(obj, dict):
        return obj.__class__((k, blank(v)) for k, v in obj.items())
    if walked(obj):
        return [blank(v) for v in obj]
    return NotLoaded()


def string_keys(obj):
    if isinstance(obj, dict):
        return {str(k): string_keys(v) for k, v in obj.items()}
    if walked(obj):
        return [string_keys(v) for v in obj]
    return obj


def bits(t):
    """A tensor's bytes, row-major: -0.0 is not 0.0, a NaN is itself."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def differences(got, want, path="", out=None):
    """Where `got` differs from `want`: tensors bit for bit, other values by
    type and ==, dicts by their keys (not their class)."""
    out = [] if out is None else out
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            out.append(f"{path}: {type(got).__name__} {got!r}, expected a tensor")
        elif got.dtype != want.dtype or got.shape != want.shape:
            out.append(f"{path}: {got.dtype} {list(got.shape)}, expected {want.dtype} {list(want.shape)}")
        elif not torch.equal(bits(got), bits(want)):
            out.append(f"{path}: values differ: {got.flatten().tolist()} vs {want.flatten().tolist()}")
    elif isinstance(want, dict):
        if not isinstance(got, dict):
            out.append(f"{path}: {type(got).__name__}, expected a dict")
            return out
        for key in sorted(set(got) ^ set(want), key=repr):
            out.append(f"{path}/{key!r}: only in {'the checkpoint' if key in got else 'the expected state'}")
        for key in want:
            if key in got:
                differences(got[key], want[key], f"{path}/{key!r}", out)
    elif isinstance(want, list) and walked(want):
        if not isinstance(got, list) or len(got) != len(want):
            out.append(f"{path}: {got!r}, expected a list of {len(want)}")
            return out
        for i, (g, w) in enumerate(zip(got, want)):
            differences(g, w, f"{path}/{i}", out)
    elif type(got) is not type(want) or got != want:
        out.append(f"{path}: {type(got).__name__} {got!r}, expected {type(want).__name__} {want!r}")
    return out


def quietly(function, *args, **kwargs):
    """DCP warns when it runs without a process group, and of TypedStorage."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return function(*args, **kwargs)


def fresh(folder):
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)


def save_one(state, folder):
    fresh(folder)
    if V2:
        quietly(dcp.save, state, checkpoint_id=folder)
    else:
        dcp.save_state_dict(flat_state(state), dcp.FileSystemWriter(folder), no_dist=True)


def raised(run):
    """[] when `run()` returns; else the line saying what it raised."""
    try:
        quietly(run)
        return []
    # A checkpoint DCP cannot read is a difference, not a crash of the check.
    # DCP's CheckpointException (a BaseException) carries each rank's
    # traceback: its last line is the cause.
    except (Exception, dcp.CheckpointException) as e:
        return [f"raised {type(e).__name__}: {(str(e).strip().splitlines() or [''])[-1]}"]


def load_v1(folder, expected):
    """1.13 loads a flat state only: STATE flattened as `write` saved it."""
    want = flat_state(expected)
    got = collections.OrderedDict((k, blank(v)) for k, v in want.items())
    return raised(lambda: dcp.load_state_dict(got, dcp.FileSystemReader(folder), no_dist=True)) \
        or differences(got, want)


def check_folder(folder, expected):
    """The differences between what DCP loads from `folder` and `expected`."""
    if not V2:
        return load_v1(folder, expected)
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    state = blank(expected)
    out = [f"load: {d}" for d in raised(lambda: dcp.load(state, checkpoint_id=folder)) or differences(state, expected)]
    with tempfile.TemporaryDirectory() as scratch:
        converted = os.path.join(scratch, "converted.pt")
        found = raised(lambda: dcp_to_torch_save(folder, converted))
        if not found:
            found = differences(torch.load(converted, weights_only=True), string_keys(expected))
    return out + [f"dcp_to_torch_save: {d}" for d in found]


def load_expected(path):
    """torch 1.x's weights-only reader has no float opcode (BINFLOAT):
    there the test's own file is read with the full unpickler."""
    return torch.load(path, weights_only=V2)


def check(folder, expected_path):
    expected = load_expected(expected_path)
    if not V2:
        try:
            dcp.FileSystemReader(folder).read_metadata()
        except (ImportError, AttributeError) as e:
            print(f"torch {torch.__version__}'s prototype DCP cannot read {folder}: its .metadata names "
                  f"classes of torch 2.x's layout ({e})")
            sys.exit(CANNOT)
    found = check_folder(folder, expected)
    for line in found:
        print(line)
    if found:
        sys.exit(1)
    print(f"torch {torch.__version__} loaded {len(flatten(expected))} values of {folder}, all as expected")


# Two ranks, spawned by torch.multiprocessing: their work is named by a
# module-level function, which the children import.
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def on_ranks(work, *args):
    import torch.multiprocessing

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    os.environ.setdefault("USE_LIBUV", "0")  # Debian's torch 2.6 has a TCPStore without libuv
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # not the host name, which a chroot may not resolve
    torch.multiprocessing.spawn(rank_main, args=(work, args), nprocs=WORLD)


# A rank ends with os._exit, its process group left alive: torch 2.6 destroys
# a Gloo group holding the GIL and joins the group's threads, one of which may
# wait for the GIL to free a tensor of a finished collective, and both wait
# for ever (the fix, pytorch#154976, came with torch 2.8). The barrier has
# already waited for every rank, and a failure's traceback is printed here,
# as spawn's own report of it would need the child to return.
def rank_main(rank, work, args):
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    status = 1
    try:
        quietly(work, rank, *args)
        dist.barrier()
        status = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def dtensor_api():
    try:
        from torch.distributed.tensor import Shard, distribute_tensor
    except ImportError:
        from torch.distributed._tensor import Shard, distribute_tensor
    from torch.distributed.device_mesh import init_device_mesh
    return Shard, distribute_tensor, init_device_mesh


def save_sharded(rank, folder):
    """dcp_two's rank: STATE with its model tensors and Adam moments
    sharded on dim 0 over the ranks."""
    Shard, distribute_tensor, init_device_mesh = dtensor_api()
    mesh = init_device_mesh("cpu", (WORLD,))
    state = state_of(*trained())
    for key, value in state["model"].items():
        state["model"][key] = distribute_tensor(value, mesh, [Shard(0)])
    for moments in state["optim"]["state"].values():
        for key in ("exp_avg", "exp_avg_sq"):
            moments[key] = distribute_tensor(moments[key], mesh, [Shard(0)])
    dcp.save(state, checkpoint_id=folder)


def save_sharded_v1(rank, folder):
    """dcp_two's rank on torch 1.13: the same split as ShardedTensors (a
    rank whose part is empty holds no shard), the state flattened by hand."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard, init_from_local_shards

    def sharded(t):
        first = (t.shape[0] + 1) // 2
        begin, size = [(0, first), (first, t.shape[0] - first)][rank]
        place = ShardMetadata([begin] + [0] * (t.dim() - 1), [size] + list(t.shape[1:]), f"rank:{rank}/cpu")
        return init_from_local_shards([Shard(t[begin:begin + size].clone(), place)] if size else [], *t.shape)

    state = state_of(*trained())
    for key, value in state["model"].items():
        state["model"][key] = sharded(value)
    for moments in state["optim"]["state"].values():
        for key in ("exp_avg", "exp_avg_sq"):
            moments[key] = sharded(moments[key])
    dcp.save_state_dict(flat_state(state), dcp.FileSystemWriter(folder))


def write(directory):
    os.makedirs(directory, exist_ok=True)
    net, optimizer = trained()
    state = state_of(net, optimizer)
    torch.save(state, os.path.join(directory, "dcp_expected.pt"))
    train(net, optimizer, batch(7, 8), 5)
    torch.save(net.state_dict(), os.path.join(directory, "dcp_continued.pt"))
    one, two = os.path.join(directory, "dcp_one"), os.path.join(directory, "dcp_two")
    save_one(state, one)
    fresh(two)
    on_ranks(save_sharded if V2 else save_sharded_v1, two)
    for folder in (one, two):
        found = check_folder(folder, state)
        if found:
            sys.exit(f"{folder} does not read back:\n" + "\n".join(found))
    print(f"torch {torch.__version__} wrote {one}, {two} and the expected states, and read both back")


# Lightning 2.6.5, src/lightning/pytorch/strategies/fsdp.py, at 2 devices
# on the CPU: FSDPStrategy._setup_model wraps the LightningModule whole
# (auto_wrap_policy None, use_orig_params True);
# lightning_module_state_dict and optimizer_state take the module's and
# FSDP.optim_state_dict in _get_sharded_state_dict_context (SHARDED, offload
# to CPU); save_checkpoint moves "state_dict" to "model" and each of
# "optimizer_states" to "optimizer_<i>", saves them with
# torch.distributed.checkpoint.save(converted, checkpoint_id=path)
# (fabric's _distributed_checkpoint_save) and, on rank 0, the rest with
# torch.save(checkpoint, path / "meta.pt").
class LitModule(torch.nn.Module):
    """A LightningModule holding NET as `self.model`."""

    def __init__(self, net):
        super().__init__()
        self.model = net


def lightning_counts(n):
    return {"ready": n, "started": n, "processed": n, "completed": n}


def lightning_loops(steps):
    """Trainer._checkpoint_connector._get_loops_state_dict() when
    ModelCheckpoint saves at the end of epoch 0 of `steps` batches."""
    batches = {"total": lightning_counts(steps), "current": lightning_counts(steps), "is_last_batch": True}
    ready_completed = {"ready": steps, "completed": steps}
    idle = {"total": lightning_counts(0), "current": lightning_counts(0), "is_last_batch": False}
    return {
        "fit_loop": {
            "state_dict": {},
            "epoch_loop.state_dict": {"_batches_that_stepped": steps},
            "epoch_loop.batch_progress": batches,
            "epoch_loop.scheduler_progress": {"total": {"ready": 0, "completed": 0},
                                              "current": {"ready": 0, "completed": 0}},
            "epoch_loop.automatic_optimization.state_dict": {},
            "epoch_loop.automatic_optimization.optim_progress": {"optimizer": {
                "step": {"total": dict(ready_completed), "current": dict(ready_completed)},
                "zero_grad": {"total": dict(ready_completed, started=steps),
                              "current": dict(ready_completed, started=steps)}}},
            "epoch_loop.manual_optimization.state_dict": {},
            "epoch_loop.manual_optimization.optim_step_progress": {"total": {"ready": 0, "completed": 0},
                                                                   "current": {"ready": 0, "completed": 0}},
            "epoch_loop.val_loop.state_dict": {},
            "epoch_loop.val_loop.batch_progress": idle,
            "epoch_progress": {"total": dict(lightning_counts(1), completed=0),
                               "current": dict(lightning_counts(1), completed=0)},
        },
        "validate_loop": {"state_dict": {}, "batch_progress": idle},
        "test_loop": {"state_dict": {}, "batch_progress": idle},
        "predict_loop": {"state_dict": {}, "batch_progress": {"total": lightning_counts(0),
                                                              "current": lightning_counts(0)}},
    }


def lightning_checkpoint(module_state, optimizer_state, path):
    """What dump_checkpoint (trainer/connectors/checkpoint_connector.py)
    returns: a Trainer(strategy=FSDPStrategy(state_dict_type="sharded"),
    max_epochs=1) with its default ModelCheckpoint, after epoch 0 of 3 steps,
    a LightningModule that called save_hyperparameters(lr=0.01)."""
    checkpoint_state = {"monitor": None, "best_model_score": None, "best_model_path": "",
                        "current_score": None, "dirpath": os.path.dirname(path), "best_k_models": {},
                        "kth_best_model_path": "", "kth_value": torch.tensor(float("inf")),
                        "last_model_path": ""}
    key = ("ModelCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': 0, 'every_n_epochs': 1, "
           "'train_time_interval': None}")
    return {"epoch": 0, "global_step": 3, "pytorch-lightning_version": "2.6.5", "state_dict": module_state,
            "loops": lightning_loops(3), "callbacks": {key: checkpoint_state},
            "optimizer_states": [optimizer_state], "lr_schedulers": [],
            "hparams_name": "kwargs", "hyper_parameters": {"lr": 0.01}}


def fsdp_trained():
    """STATE's network and Adam, as FSDPStrategy holds them."""
    from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    net, optimizer = trained()
    optimizer.zero_grad(set_to_none=True)  # FSDP would shard the last gradients too
    # Lightning passes device_id=None on the CPU, which torch 2.6's FSDP
    # refuses ("needs a non-CPU accelerator device"): the CPU stands in for
    # the GPU of a real run.
    model = FSDP(LitModule(net), use_orig_params=True, device_id=torch.device("cpu"))
    adam = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.9, 0.99))
    full = lightning_state(state_of(net, optimizer))["optimizer_0"]
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=False),
                              FullOptimStateDictConfig(rank0_only=False)):
        adam.load_state_dict(FSDP.optim_state_dict_to_load(model, adam, full))
    return model, adam


def lightning_state(state):
    """STATE keyed as the sharded checkpoint's DCP folder keys it: the
    LightningModule's parameter names, the optimizer's state by name."""
    names = ["model." + k for k in state["model"]]
    optim = state["optim"]
    return {"model": collections.OrderedDict(("model." + k, v) for k, v in state["model"].items()),
            "optimizer_0": {"state": {names[i]: v for i, v in optim["state"].items()},
                            "param_groups": [dict(g, params=[names[i] for i in g["params"]])
                                             for g in optim["param_groups"]]}}


def save_lightning(rank, path):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardedOptimStateDictConfig, ShardedStateDictConfig, StateDictType

    model, adam = fsdp_trained()
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(offload_to_cpu=True),
                              ShardedOptimStateDictConfig(offload_to_cpu=True)):
        checkpoint = lightning_checkpoint(model.state_dict(), FSDP.optim_state_dict(model, adam), path)
    converted_state = {"model": checkpoint.pop("state_dict")}
    converted_state.update({f"optimizer_{idx}": optim_state
                            for idx, optim_state in enumerate(checkpoint.pop("optimizer_states", []))})
    dcp.save(converted_state, checkpoint_id=path)
    if rank == 0:
        torch.save(checkpoint, os.path.join(path, "meta.pt"))


def lightning(directory):
    if not V2:
        print(f"SKIP: Lightning 2.6.5 requires torch >= 2.1 (requirements/pytorch/base.txt) and saves sharded checkpoints "
              f"with torch.distributed.checkpoint, which torch {torch.__version__} has only as a prototype")
        sys.exit(CANNOT)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "lightning_sharded.ckpt")
    fresh(path)
    on_ranks(save_lightning, path)
    expected = lightning_state(state_of(*trained()))
    torch.save(expected, os.path.join(directory, "lightning_expected.pt"))
    found = check_folder(path, expected)
    if found:
        sys.exit(f"{path} does not read back:\n" + "\n".join(found))
    meta = torch.load(os.path.join(path, "meta.pt"), weights_only=True)
    print(f"torch {torch.__version__} wrote {path} (meta.pt: {', '.join(meta)}) and lightning_expected.pt")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "write":
        write(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "lightning":
        lightning(sys.argv[2])
    else:
        sys.exit(__doc__)
