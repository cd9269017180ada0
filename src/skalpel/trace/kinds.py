"""Event kinds: every trace event is classified once, at load time.

Kineto has renamed its categories over the years (2021's ``Operator``/``Runtime``/
``Kernel`` became ``cpu_op``/``cuda_runtime``/``kernel``), and some host events
carry their meaning in the name rather than the category (``ProfilerStep#N``,
``enumerate(DataLoader)...``, ``nccl:all_reduce``). This module folds all of that
into one small integer ``Kind`` so that no analysis ever looks at a category
string or classifies a name again.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable

import numpy as np


class Kind(enum.IntEnum):
    OTHER = 0
    CPU_OP = 1  # aten ops and other operator-level host events
    USER_ANNOTATION = 2  # record_function ranges
    STEP = 3  # ProfilerStep#N
    DATALOADER = 4  # enumerate(DataLoader)#... or enumerate(DataPipe)#...: the wait for the next batch
    COMM_OP = 5  # host side of a collective: nccl:all_reduce, gloo:broadcast, c10d::...
    PYTHON = 6  # python_function frames (with_stack)
    RUNTIME = 7  # cudaLaunchKernel, hipMemcpyWithStream, mtia runtime calls
    DRIVER = 8  # cuLaunchKernel and other driver API calls
    KERNEL = 9  # device compute kernel
    COMM_KERNEL = 10  # device collective kernel (NCCL, RCCL, symmetric memory)
    MEMCPY = 11
    MEMSET = 12
    DEVICE_SYNC = 13  # cuda_sync: the device-side record of a synchronisation
    GPU_ANNOTATION = 14  # gpu_user_annotation: a record_function range projected onto a stream
    MEMORY = 15  # [memory] instant event: one allocation or free
    INSTANT = 16  # any other instant event
    OVERHEAD = 17  # profiler overhead spans


DEVICE_KINDS = frozenset({Kind.KERNEL, Kind.COMM_KERNEL, Kind.MEMCPY, Kind.MEMSET})
"""Device work that occupies a stream: what HTA and the TensorBoard plugin call GPU activity."""

HOST_OP_KINDS = frozenset({Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.DATALOADER, Kind.COMM_OP})
"""Host ranges that appear in an operator table."""

LAUNCH_KINDS = frozenset({Kind.RUNTIME, Kind.DRIVER})

LAUNCHED_KINDS = DEVICE_KINDS | {Kind.DEVICE_SYNC}
"""Device records that a runtime call launched (same correlation id): device work, and a sync's device record."""


def kind_array(kinds: Iterable[Kind]) -> np.ndarray:
    """Kinds as a sorted int8 array, the form ``isin_few`` and ``np.isin`` compare the ``kind`` column with."""
    return np.array(sorted(int(k) for k in kinds), dtype=np.int8)


DEVICE_KIND_ARRAY = kind_array(DEVICE_KINDS)
"""``DEVICE_KINDS`` as an array, for masks over the ``kind`` column."""

_CATEGORY_KINDS = {
    "cpu_op": Kind.CPU_OP,
    "operator": Kind.CPU_OP,
    "user_annotation": Kind.USER_ANNOTATION,
    "python_function": Kind.PYTHON,
    "python": Kind.PYTHON,
    "cuda_runtime": Kind.RUNTIME,
    "runtime": Kind.RUNTIME,
    "hip_runtime": Kind.RUNTIME,
    "mtia_runtime": Kind.RUNTIME,
    "privateuse1_runtime": Kind.RUNTIME,
    "cuda_driver": Kind.DRIVER,
    "driver": Kind.DRIVER,
    "privateuse1_driver": Kind.DRIVER,
    "kernel": Kind.KERNEL,
    "mtia_ccp_events": Kind.KERNEL,
    "cuda_profiler_range": Kind.KERNEL,
    "gpu_memcpy": Kind.MEMCPY,
    "memcpy": Kind.MEMCPY,
    "gpu_memset": Kind.MEMSET,
    "memset": Kind.MEMSET,
    "cuda_sync": Kind.DEVICE_SYNC,
    "gpu_user_annotation": Kind.GPU_ANNOTATION,
    "overhead": Kind.OVERHEAD,
    "cpu_instant_event": Kind.INSTANT,
    "memory": Kind.MEMORY,
}

_STEP_NAME = re.compile(r"^ProfilerStep#(\d{1,18})$")  # fits in 64 bits
_COMM_OP_PREFIXES = ("nccl:", "gloo:", "c10d::", "mpi:", "ucc:", "xccl:", "record_param_comms")
# a kernel that moves data between ranks: NCCL/RCCL/MSCCL's (ncclDevKernel_*, ncclKernel_*), symmetric memory's
# (multimem_*, one/two_shot_all_reduce) and custom all-reduces (vLLM's cross_device_reduce), and the all-to-all of
# expert parallelism written as kernels of its own (pplx's, NVSHMEM's, userbuffers', MoRI's EpDispatch*/EpCombine*)
_COMM_KERNEL_MARKERS = (
    "nccl", "rccl", "multimem_", "one_shot_all_reduce", "two_shot_all_reduce", "cross_device_reduce",
    "all_reduce_kernel", "allreduce", "alltoall", "all_to_all", "all2all", "pplx::", "nvshmem", "userbuffers",
    "epdispatch", "epcombine",
)  # fmt: skip
# DeepEP and its forks and in-house builds name kernels by namespace, and rename the top one: deep_ep::internode::
# dispatch, dpsk::ep::internode::combine, dpsk::ep::cuda::get_dispatch_layout, hybrid_ep::...; a namespace segment of
# its own (not "step::" or "epilogue::") for the library or for its intranode/internode(_ll) kernels marks the family
_EP_NAMESPACE = re.compile(r"(?<![a-z0-9_])(?:deep_ep|hybrid_ep|ep|intranode|internode|internode_ll)::")


# Kineto's first schema (torch 1.8 to 1.11) filed record_function ranges under "Operator" with the ops. An op there
# is named with its namespace (aten::, prim::, torch::autograd::), or is an autograd node (AddmmBackward,
# AddBackward0, CopyBackwards, CopySlices) or one of the ops recorded bare (detach, detach_); a runtime call filed
# there keeps its name (cudaLaunchKernel). Any other name is the user's range (record_function("model_inference"),
# torch.optim's Optimizer.step#SGD.step), which today's traces file under "user_annotation".
_OLD_OPERATOR_OP = re.compile(r"::|^(?:\w+Backwards?\d*|CopySlices|detach_?|(?:cuda|cu|hip)[A-Z]\w*)$")


_LEGACY_PIDS = {"CPU functions": "cpu_op", "CUDA functions": "kernel"}


def legacy_category(category: str | None, pid: object) -> str | None:
    """The category of an event of the pre-Kineto exporter (torch <= 1.8's autograd profiler).

    Its ``export_chrome_trace`` wrote no ``cat``: host ops under pid "CPU functions" and
    kernels under pid "CUDA functions". Any other event keeps its own category.
    """
    if category or not isinstance(pid, str):
        return category
    return _LEGACY_PIDS.get(pid, category)


def classify(category: str | None, name: str, phase: str) -> Kind:
    """Return the kind of one event from its category, name and phase."""
    if phase in ("i", "I"):
        return Kind.MEMORY if name == "[memory]" else Kind.INSTANT
    lowered = category.lower() if category else ""
    kind = _CATEGORY_KINDS.get(lowered, Kind.OTHER)
    if lowered == "operator" and not _OLD_OPERATOR_OP.search(name):
        kind = Kind.USER_ANNOTATION
    if kind in (Kind.CPU_OP, Kind.USER_ANNOTATION):
        return _refine_host_range(kind, name)
    if kind is Kind.KERNEL and is_comm_kernel_name(name):
        return Kind.COMM_KERNEL
    return kind


def _refine_host_range(kind: Kind, name: str) -> Kind:
    if name.startswith("ProfilerStep#"):
        return Kind.STEP
    if name.startswith(("enumerate(DataLoader)", "enumerate(DataPipe)")):
        return Kind.DATALOADER
    if name.startswith(_COMM_OP_PREFIXES):
        return Kind.COMM_OP
    return kind


def is_comm_kernel_name(name: str) -> bool:
    lowered = name.lower()
    return any(marker in lowered for marker in _COMM_KERNEL_MARKERS) or _EP_NAMESPACE.search(lowered) is not None


def step_number(name: str) -> int | None:
    """The N of ``ProfilerStep#N``, or None for any other name (and for an N beyond 64 bits)."""
    match = _STEP_NAME.match(name)
    return int(match.group(1)) if match else None
