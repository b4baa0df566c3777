"""Collectives on picklable Python objects (torch.distributed's all_gather_object and
broadcast_object_list): each object is pickled into a byte array, the sizes go first,
then the bytes, each step a bounded collective like the tensor ones. As in PyTorch,
unpickling runs whatever the sender pickled: use them between trusted ranks only."""
import pickle

import numpy as np

from jitgrad.distributed.collectives import _group, _peer
from jitgrad.distributed.work import Work


def all_gather_object(object_list, obj, group=None):
    """object_list[i] = rank i's `obj`, on every rank (object_list: one entry per rank)."""
    pg = _group(group, "all_gather_object")
    mine = np.frombuffer(pickle.dumps(obj), np.uint8)
    sizes = np.empty(pg.size(), np.int64)
    Work([pg.comm.Iallgather(np.array([mine.size], np.int64), sizes)], name="all_gather_object").wait()
    data = np.empty(int(sizes.sum()), np.uint8)
    Work([pg.comm.Iallgatherv(mine, [data, sizes])], name="all_gather_object", keep=(mine,)).wait()
    ends = np.cumsum(sizes)
    for i in range(pg.size()):
        object_list[i] = pickle.loads(data[ends[i] - sizes[i]:ends[i]].tobytes())


def broadcast_object_list(object_list, src=None, group=None, device=None, group_src=None):
    """Replace the objects of `object_list` on every rank by those of rank `src` (every
    rank passes a list of the same length)."""
    pg = _group(group, "broadcast_object_list")
    src = _peer(src, group_src)
    if not 0 <= src < pg.size():
        raise RuntimeError(f"ProcessGroupMPI::broadcast: invalid root rank: {src}")
    if pg.rank() == src:
        parts = [pickle.dumps(o) for o in object_list]
        sizes = np.array([len(p) for p in parts], np.int64)
    else:
        sizes = np.empty(len(object_list), np.int64)
    Work([pg.comm.Ibcast(sizes, root=src)], name="broadcast_object_list").wait()
    data = np.frombuffer(b"".join(parts), np.uint8) if pg.rank() == src else np.empty(int(sizes.sum()), np.uint8)
    Work([pg.comm.Ibcast(data, root=src)], name="broadcast_object_list").wait()
    if pg.rank() != src:
        ends = np.cumsum(sizes)
        for i in range(len(object_list)):
            object_list[i] = pickle.loads(data[ends[i] - sizes[i]:ends[i]].tobytes())
