"""Ray's GPU ids of a train worker as the NVML indices wandb's monitor reports (pure).

Ray names a worker's GPUs as its raylet sees them: ``"0"``, ``"3"`` (the node's GPUs, or the
entries of the ``CUDA_VISIBLE_DEVICES`` the raylet was started under), or UUIDs
(``"GPU-8f2c..."``) and MIG devices (``"MIG-..."``) when that variable named them so. wandb's
monitor reports every GPU NVML sees, by NVML index (PCI order, whatever ``CUDA_VISIBLE_DEVICES``
says), with each GPU's UUID. So:

- an integer id is taken as the NVML index. That holds when the raylet's GPUs are the host's in
  NVML order: a raylet started under ``CUDA_VISIBLE_DEVICES=2,3`` says ``"2"``, ``"3"``, NVML's
  indices too. CUDA's own order can differ from NVML's on hosts of mixed GPU models (CUDA
  orders the fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``);
- a ``GPU-`` UUID is looked up among the UUIDs the monitor reports (exact, in any order);
- a MIG device has no index of its own in the monitor's series (NVML reports no utilisation of a
  MIG slice, and wandb samples the whole GPU): it maps to nothing, and the node is then judged
  by every GPU it reports.

A Tune trial's GPUs are known only as Ray's slots on its node (:class:`GpuSlots`, read from the
GCS, see ``_ray.actor_location``): slot ``i`` is the node's ``i``-th GPU as Ray numbers them, the
``i``-th entry of the ``CUDA_VISIBLE_DEVICES`` its raylet was started under, or ``i`` when none
was set. :func:`slots_as_ids` turns them into ids as above, with the node's Ray GPU ids its
reader sends (``GpuInventory.ray_ids``), as Ray's ``get_gpu_ids`` does inside the trial.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

_PG_GPU = re.compile(r"^GPU_group_[0-9A-Za-z]+$")


class GpuSlots(NamedTuple):
    """A process's GPUs as Ray's slots on its node (a Tune trial's, from the GCS's record of
    its actor), to be named as Ray names them once the node's Ray GPU ids are known."""

    slots: tuple[int, ...]


# A rank's GPUs: ids as Ray names them ("0", "GPU-<uuid>"), or slots to name on its node.
RankGpus = tuple[str, ...] | GpuSlots


def as_ids(gpus: RankGpus | None, ray_ids: Sequence[str] | None, listed: bool) -> tuple[str, ...] | None:
    """A rank's GPUs as Ray names them: ids as given; slots named by the node's ``ray_ids`` once
    its GPUs are ``listed`` (its inventory came), None before (not known yet)."""
    if isinstance(gpus, GpuSlots):
        return slots_as_ids(gpus.slots, ray_ids) if listed else None
    return gpus


def named(gpus: RankGpus) -> tuple[str, ...]:
    """A rank's GPU ids as Ray names them; ``()`` for slots not yet named on their node."""
    return () if isinstance(gpus, GpuSlots) else tuple(gpus)


def gpu_slots(mapping: Iterable[tuple[str, Iterable[int]]]) -> tuple[int, ...]:
    """The GPU slots in a worker's resource mapping (resource name -> slot indices), as Ray's
    ``get_gpu_ids`` reads it: ``GPU`` and a placement group's ``GPU_group_<pg>``, never the
    per-bundle ``GPU_group_<i>_<pg>`` (the same slots again)."""
    out: set[int] = set()
    for name, slots in mapping:
        if name == "GPU" or _PG_GPU.match(name):
            out.update(int(s) for s in slots)
    return tuple(sorted(out))


def slots_as_ids(slots: Iterable[int], ray_ids: Sequence[str] | None) -> tuple[str, ...] | None:
    """GPU ``slots`` as Ray names them on a node whose Ray GPU ids are ``ray_ids`` (None: its
    raylet saw every GPU, slot ``i`` is ``"i"``); None when a slot is past them (Ray then hands
    the process every id, and which GPU it uses is not known)."""
    slots = list(slots)
    if ray_ids is None:
        return tuple(str(s) for s in slots)
    if all(0 <= s < len(ray_ids) for s in slots):
        return tuple(str(ray_ids[s]) for s in slots)
    return None


def visible_gpu_ids(environ: str = "/proc/self/environ") -> tuple[str, ...] | None:
    """The GPU ids Ray's workers on this node see, as Ray numbers them: the
    ``CUDA_VISIBLE_DEVICES`` this process started under (a Ray worker's is its raylet's, with the
    job's ``runtime_env``), read as Ray reads it when a worker starts; None when it was not set
    (slot ``i`` is GPU ``i``) or cannot be read. Not ``os.environ``: Ray may set that variable
    in a worker since, for the worker's own GPUs."""
    try:
        with open(environ, "rb") as f:
            entries = f.read().split(b"\0")
    except OSError:
        return None
    value = next((e[len(b"CUDA_VISIBLE_DEVICES=") :] for e in entries if e.startswith(b"CUDA_VISIBLE_DEVICES=")), None)
    if value is None:
        return None
    text = value.decode(errors="replace").strip()
    return () if text in ("", "NoDevFiles") else tuple(i.strip() for i in text.split(","))


def ray_gpu_ids(accelerator_ids: object) -> tuple[str, ...]:
    """A worker's GPU ids from Ray's ``accelerator_ids`` (``{"GPU": [...]}``), as strings."""
    ids = accelerator_ids.get("GPU", []) if isinstance(accelerator_ids, dict) else []
    return tuple(str(i).strip() for i in ids or () if str(i).strip())


def nvml_indices(ids: Iterable[str], uuids: Sequence[str] | None = None) -> tuple[int, ...] | None:
    """The NVML indices of Ray GPU ``ids``; None when any of them cannot be mapped (a UUID not
    among the monitor's ``uuids``, or not known yet; a MIG device; anything else)."""
    out = []
    for gpu in ids:
        if gpu.isdigit():
            out.append(int(gpu))
        elif gpu.startswith("GPU-") and uuids and gpu in uuids:
            out.append(list(uuids).index(gpu))
        else:
            return None
    return tuple(out)


@contextlib.contextmanager
def _nvml(library: str) -> Iterator[Any]:
    """NVML loaded and initialised for one short read (None where it cannot be), shut down after."""
    import ctypes

    try:
        nvml = ctypes.CDLL(library)
    except OSError:
        yield None
        return
    if nvml.nvmlInit_v2() != 0:
        yield None
        return
    try:
        yield nvml
    finally:
        nvml.nvmlShutdown()


def lookup_on_node(ids: Iterable[str], library: str = "libnvidia-ml.so.1") -> tuple[int, ...] | None:
    """The NVML indices of Ray GPU ``ids`` on this node, UUIDs looked up in NVML itself (one
    lookup when a writer starts, not a sampler); None when NVML or any id is not found (MIG
    devices included: their parent GPU is what wandb samples, and it is left to sample all)."""
    import ctypes

    ids = list(ids)
    direct = nvml_indices(ids)
    if direct is not None:
        return direct
    with _nvml(library) as nvml:
        if nvml is None:
            return None
        out = []
        for gpu in ids:
            handle, index = ctypes.c_void_p(), ctypes.c_uint()
            if gpu.isdigit():
                out.append(int(gpu))
            elif (
                gpu.startswith("GPU-")
                and nvml.nvmlDeviceGetHandleByUUID(gpu.encode(), ctypes.byref(handle)) == 0
                and nvml.nvmlDeviceGetIndex(handle, ctypes.byref(index)) == 0
            ):
                out.append(index.value)
            else:
                return None
        return tuple(out)


def nvml_inventory(library: str = "libnvidia-ml.so.1") -> dict[str, list[str]] | None:
    """This node's GPUs as NVML lists them (index order): ``models`` and ``uuids``; None without
    NVML, or when no GPU answers. One read when a writer starts (a node writer's wandb records no
    metadata of its own, so this is where its GPUs' models and UUIDs come from); nothing is
    sampled. A GPU NVML cannot read (off the bus: ``NVML_ERROR_GPU_IS_LOST`` from its handle
    lookup) keeps its index with an empty model and UUID, and the node's other GPUs are listed."""
    import ctypes

    with _nvml(library) as nvml:
        count = ctypes.c_uint()
        if nvml is None or nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0 or not count.value:
            return None
        models, uuids = [], []
        for i in range(min(count.value, 64)):
            handle = ctypes.c_void_p()
            name, uuid = ctypes.create_string_buffer(96), ctypes.create_string_buffer(96)
            if nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) == 0:
                nvml.nvmlDeviceGetName(handle, name, 96)
                nvml.nvmlDeviceGetUUID(handle, uuid, 96)
            models.append(name.value.decode(errors="replace"))
            uuids.append(uuid.value.decode(errors="replace"))
        return {"models": models, "uuids": uuids} if any(models) or any(uuids) else None
