"""The weight-update process group as SGLang builds it (used by the stand-in's engine side and by the
conformance tests' trainer side)."""

from __future__ import annotations

from datetime import timedelta


def sglang_process_group(address: str, port: int, rank: int, world_size: int, group_name: str):
    """A gloo process group built as SGLang 0.5.15's ``init_custom_process_group`` builds the engine's
    side (a ``tcp://`` rendezvous, the store prefixed by ``group_name``, torch's own group helper,
    which prefixes the keys again): a group built otherwise (a bare ``ProcessGroupGloo`` on a
    ``PrefixStore``) never connects to the real server, whose scheduler then hangs in the join."""
    import torch.distributed.distributed_c10d as c10d

    timeout = timedelta(seconds=120)
    for old, name in list(c10d._world.pg_names.items()):  # an earlier group of that name in this process
        if name == group_name:  # (a test's previous updater): its name is reused
            c10d.destroy_process_group(old)
    store, rank, world_size = next(c10d.rendezvous(f"tcp://{address}:{port}", rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    group, _ = c10d._new_process_group_helper(
        world_size,
        rank,
        [],
        c10d.Backend("gloo"),
        c10d.PrefixStore(group_name, store),
        group_name=group_name,
        timeout=timeout,
    )
    c10d._world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return group
