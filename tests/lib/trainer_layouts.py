"""Checkpoints laid out the way the popular trainers write them, made with
Debian's python3-torch (import under /usr/bin/python3 only). The trainers
themselves (Lightning, transformers, DeepSpeed, Megatron-LM, Keras) are not
installed: each function builds the same files with torch.save the way that
trainer's own code does, and says where in that code the layout comes from.

Every expected value a test compares against (epochs, steps, outputs) comes
from here or from torch, never from ckptd."""
import collections
import io
import json
import os


def net_class():
    import torch

    class Net(torch.nn.Module):
        """A small MLP: fc1 -> relu -> fc2 (the module's own names)."""

        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(6, 16)
            self.fc2 = torch.nn.Linear(16, 3)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))

    # a module-level class, as a training script's own: torch.save(model) pickles it by name
    Net.__qualname__ = "Net"
    globals()["Net"] = Net
    return Net


LAYERS = ("input: {name: x, shape: [-1, 6]}\nlayers:\n"
          "  - {op: dense, weight: fc1.weight, bias: fc1.bias}\n"
          "  - {op: relu}\n"
          "  - {op: dense, weight: fc2.weight, bias: fc2.bias}\n")


def lightning_module(net):
    """A LightningModule keeps its network as self.model: its state_dict
    names every weight 'model.fc1.weight' (what Lightning saves)."""
    import torch

    class LitModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = net

    return LitModel()


def train_step(net, opt, seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 6, generator=g)
    opt.zero_grad()
    net(x).square().mean().backward()
    opt.step()


def _progress(ready, completed=None):
    completed = ready if completed is None else completed
    return {"ready": ready, "completed": completed, "started": ready, "processed": ready}


def lightning_dict(lit, opt, sched, epoch, global_step, monitor=None, best=None):
    """The dict Lightning's CheckpointConnector.dump_checkpoint builds
    (lightning 2.1, pytorch_lightning/trainer/connectors/checkpoint_connector.py):
    epoch and global_step first, the version, the LightningModule's state_dict,
    the loops' progress, the callbacks' states keyed by their state_key,
    optimizer_states and lr_schedulers as lists of state_dicts, hyper_parameters."""
    import torch
    steps = global_step
    loops = {
        "fit_loop": {
            "state_dict": {},
            "epoch_loop.state_dict": {"_batches_that_stepped": steps},
            "epoch_loop.batch_progress": {"total": _progress(steps), "current": _progress(1),
                                          "is_last_batch": True},
            "epoch_loop.scheduler_progress": {"total": {"ready": epoch + 1, "completed": epoch + 1},
                                              "current": {"ready": 1, "completed": 1}},
            "epoch_loop.automatic_optimization.state_dict": {},
            "epoch_loop.automatic_optimization.optim_progress": {
                "optimizer": {"step": {"total": {"ready": steps, "completed": steps},
                                       "current": {"ready": 1, "completed": 1}},
                              "zero_grad": {"total": _progress(steps), "current": _progress(1)}}},
            "epoch_loop.val_loop.state_dict": {},
            "epoch_progress": {"total": _progress(epoch + 1, epoch), "current": _progress(epoch + 1, epoch)},
        },
        "validate_loop": {"state_dict": {}, "dataloader_progress": {"total": {"ready": 0, "completed": 0},
                                                                  "current": {"ready": 0, "completed": 0}}},
        "test_loop": {"state_dict": {}},
        "predict_loop": {"state_dict": {}},
    }
    key = ("ModelCheckpoint{'monitor': %r, 'mode': 'min', 'every_n_train_steps': 0, "
           "'every_n_epochs': 1, 'train_time_interval': None}" % monitor)
    callbacks = {key: {
        "monitor": monitor, "best_model_score": None if best is None else torch.tensor(best),
        "best_model_path": "", "current_score": None if best is None else torch.tensor(best),
        "dirpath": "/train/lightning_logs/version_0/checkpoints", "best_k_models": {},
        "kth_best_model_path": "", "kth_value": torch.tensor(float("inf")), "last_model_path": ""}}
    return {
        "epoch": epoch,
        "global_step": global_step,
        "pytorch-lightning_version": "2.1.3",
        "state_dict": lit.state_dict(),
        "loops": loops,
        "callbacks": callbacks,
        "optimizer_states": [opt.state_dict()],
        "lr_schedulers": [sched.state_dict()],
        "hparams_name": "kwargs",
        "hyper_parameters": {"lr": 0.01, "hidden": 16},
    }


def lightning_save(ckpt, path):
    """Lightning's _atomic_save: torch.save into memory, then the bytes to the file."""
    import torch
    buf = io.BytesIO()
    torch.save(ckpt, buf)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(buf.getvalue())


def hf_checkpoint(folder, net, opt, sched, epoch, global_step, max_steps, write_state=True):
    """transformers' Trainer._save_checkpoint (4.3x): the model
    (pytorch_model.bin: torch.save of its state_dict, and config.json),
    optimizer.pt, scheduler.pt, trainer_state.json (TrainerState.save_to_json:
    json.dumps(asdict(state), indent=2, sort_keys=True) + newline), then
    rng_state.pth. epoch is a float: epochs done."""
    import torch
    os.makedirs(folder, exist_ok=True)
    torch.save(net.state_dict(), os.path.join(folder, "pytorch_model.bin"))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"architectures": ["Net"], "hidden_size": 16}, f, indent=2, sort_keys=True)
    torch.save(opt.state_dict(), os.path.join(folder, "optimizer.pt"))
    torch.save(sched.state_dict(), os.path.join(folder, "scheduler.pt"))
    if write_state:
        state = {"best_metric": None, "best_model_checkpoint": None, "epoch": float(epoch),
                 "eval_steps": 500, "global_step": global_step, "is_hyper_param_search": False,
                 "is_local_process_zero": True, "is_world_process_zero": True,
                 "log_history": [{"epoch": float(epoch), "learning_rate": 4e-05, "loss": 0.25,
                                  "step": global_step}],
                 "logging_steps": 500, "max_steps": max_steps, "num_train_epochs": 3,
                 "save_steps": 500, "total_flos": 0.0, "train_batch_size": 8,
                 "trial_name": None, "trial_params": None}
        with open(os.path.join(folder, "trainer_state.json"), "w") as f:
            f.write(json.dumps(state, indent=2, sort_keys=True) + "\n")
    torch.save({"python": 1, "numpy": 2, "cpu": torch.get_rng_state()},
               os.path.join(folder, "rng_state.pth"))


def deepspeed_checkpoint(save_dir, net, opt, step):
    """DeepSpeedEngine.save_checkpoint (ZeRO stage 1): tag 'global_step{step}',
    mp_rank_00_model_states.pt holding the module's state_dict under 'module'
    with param_shapes (torch.Size), the optimizer's partition in
    zero_pp_rank_0_mp_rank_00_optim_states.pt, then the 'latest' file naming
    the tag (written last)."""
    import torch
    tag = f"global_step{step}"
    folder = os.path.join(save_dir, tag)
    os.makedirs(folder, exist_ok=True)
    sd = net.state_dict()
    torch.save({"module": sd, "buffer_names": [], "optimizer": None,
                "param_shapes": [collections.OrderedDict((k, v.shape) for k, v in sd.items())],
                "frozen_param_shapes": None, "shared_params": {}, "frozen_param_fragments": None,
                "lr_scheduler": None, "data_sampler": None, "random_ltd": None,
                "sparse_tensor_module_names": set(), "skipped_steps": 0,
                "global_steps": step, "global_samples": step * 8, "dp_world_size": 1,
                "mp_world_size": 1, "ds_config": {"train_batch_size": 8,
                                                  "zero_optimization": {"stage": 1}},
                "ds_version": "0.12.6"},
               os.path.join(folder, "mp_rank_00_model_states.pt"))
    torch.save({"optimizer_state_dict": opt.state_dict(), "ds_config": {}, "ds_version": "0.12.6"},
               os.path.join(folder, "zero_pp_rank_0_mp_rank_00_optim_states.pt"))
    with open(os.path.join(save_dir, "latest"), "w") as f:
        f.write(tag)
    return tag


def megatron_checkpoint(save_dir, net, iteration, write_tracker=True):
    """Megatron-LM's save_checkpoint: iter_{iteration:07d}/mp_rank_00/
    model_optim_rng.pt, then latest_checkpointed_iteration.txt (the number)."""
    import torch
    name = f"iter_{iteration:07d}"
    folder = os.path.join(save_dir, name, "mp_rank_00")
    os.makedirs(folder, exist_ok=True)
    torch.save({"args": None, "checkpoint_version": 3.0, "iteration": iteration,
                "model": net.state_dict()}, os.path.join(folder, "model_optim_rng.pt"))
    if write_tracker:
        with open(os.path.join(save_dir, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(iteration))
    return name


def dcp_checkpoint(folder, net):
    """torch.distributed.checkpoint's FileSystemWriter layout: the data file
    __0_0.distcp, then .metadata (written last: the folder's marker). torch
    1.13's DCP cannot run under Python 3.11, so the files are written by
    name; what they hold does not matter for registration."""
    import pickle
    import torch
    os.makedirs(folder, exist_ok=True)
    torch.save(net.state_dict(), os.path.join(folder, "__0_0.distcp"))
    with open(os.path.join(folder, ".metadata"), "wb") as f:  # FileSystemWriter: pickle.dump
        pickle.dump({"state_dict_metadata": {}, "planner_data": None}, f)
