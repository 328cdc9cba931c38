"""lgip.ranks: a run's processes under torchrun (each rank a share of the records, rank 0 the one that writes):
the rank and world size, torch.distributed started when torchrun launched the run, objects gathered from every
rank. A run of one process is rank 0 of 1 and starts nothing."""

import os


def distributed():
    """(rank, world size), starting torch.distributed when launched by torchrun."""
    import torch
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1
    if not dist.is_initialized():
        # Imported before the group exists: its functions take `group=group.WORLD` as a default
        # argument, which binds the group itself when the module is first imported after it starts
        # (open_clip and transformers import it while a model loads). Ten such references kept the
        # group, and its gloo threads, alive after destroy_process_group, into the interpreter's
        # exit, where a rank aborted now and then ("terminate called without an active exception").
        import torch.distributed.nn

        backend = "nccl" if torch.cuda.is_available() and os.environ.get("LGIP_DIST_BACKEND") != "gloo" else "gloo"
        if backend == "nccl":
            # NCCL's collectives (all_gather_object's tensors too) run on the current device, cuda:0
            # unless set: every rank on one GPU is refused ("Duplicate GPU detected") or hangs.
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size()


def _gather(obj, world):
    import torch.distributed as dist

    if world == 1:
        return [obj]
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


def is_main_process():
    """True on rank 0 (and in a run of one process): where the rows are and the outputs are written.
    Ask before evaluate_models ends (under torchrun it then leaves the process group)."""
    return distributed()[0] == 0
