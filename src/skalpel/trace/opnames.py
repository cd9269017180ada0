"""Op-specific knowledge of event names that is not a role: which copies go device to host, which kernels Triton
generated, which aten ops have a FLOP formula, a collective's type. Analyses ask here, by name id, and never test a
name themselves; each helper tests each distinct name once, never each event.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable

import numpy as np

from .model import Trace
from .roles import COMPILED_REGION


def names_where(trace: Trace, test: Callable[[str], object], events: np.ndarray | None = None) -> list[int]:
    """The name ids, ascending, of ``events`` (of every event when None) whose name passes ``test``."""
    used = trace.name if events is None else trace.name[events]
    if len(used) == 0:
        return []
    ids = np.flatnonzero(np.bincount(used))
    return [int(i) for i in ids if test(trace.names[int(i)])]


def ids_of(trace: Trace, names: Iterable[str]) -> list[int]:
    """The ids of those of ``names`` that some event has, in the order given."""
    return [i for i in (trace.name_id(name) for name in names) if i >= 0]


def is_dtoh_copy(name: str) -> bool:
    """A device-to-host copy (pinned or pageable)."""
    return name.startswith("Memcpy DtoH")


# The TensorBoard plugin counts only these host ops as communication (its quirk, kept by plugin_quirks).
PLUGIN_COMM_OPS = frozenset(
    f"{lib}:{op}" for lib in ("nccl", "gloo") for op in ("broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter")
)


_ADDRESS = re.compile(r" of [^<>]*? object at 0x[0-9a-fA-F]+>$")  # "<built-in method add_ of Parameter object at 0x7f..>"
# skalpel's own frames around and inside the user's loop (`skalpel run`, the step hooks, runpy):
# not the user's code, so the flame graph leaves them out and gives their time to their callers.
_OWN_FRAME = re.compile(
    r"^(<frozen runpy>|(.*/)?runpy\.py|(.*/)?bin/skalpel|(.*/)?skalpel/(cli|__main__)\.py"
    r"|(.*/)?skalpel/capture/\w+\.py)\(\d+\): "
)


def is_skalpel_frame(name: str) -> bool:
    """A Python frame of skalpel's own (``skalpel run``, its step hooks, runpy), not of the user's code."""
    return _OWN_FRAME.match(name) is not None


def without_addresses(names: list[str]) -> list[str]:
    """Each name with a bound method's object address dropped, so that one method on two objects is one frame."""
    return [_ADDRESS.sub(">", name) if name.startswith("<") else name for name in names]


RECORD_PARAM_COMMS = "record_param_comms"  # the generic host op around a collective; the backend op names its type
_HOST_BACKENDS = ("gloo:", "mpi:", "ucc:", "xccl:")
_COLLECTIVE_PREFIXES = ("nccl:", "gloo:", "mpi:", "ucc:", "xccl:", "c10d::", "ncclkernel_", "nccldevkernel_", "rcclkernel_")
_TYPE_PREFIXES = (
    ("allreduce", "all_reduce"), ("allgather", "all_gather"), ("reducescatter", "reduce_scatter"),
    ("alltoall", "all_to_all"), ("broadcast", "broadcast"), ("barrier", "barrier"),
    ("sendrecv", "send_recv"), ("send", "send_recv"), ("recv", "send_recv"), ("reduce", "reduce"),
    ("gather", "gather"), ("scatter", "scatter"),
)  # fmt: skip


def id_of(trace: Trace, name: str) -> int:
    """The id of ``name`` (one of this module's names), or -1 when no event has it."""
    return trace.name_id(name)


def is_host_backend_collective(name: str) -> bool:
    """A collective timed on the host by its backend (gloo, MPI, UCC, XCCL): no device kernel times it."""
    return name.startswith(_HOST_BACKENDS)


def is_c10d_collective(name: str) -> bool:
    return name.startswith("c10d::")


@functools.lru_cache(maxsize=256)  # thousands of kernels share a handful of names
def collective_type(name: str) -> str:
    """The canonical type of a collective from any of its names (op, kernel, 'Collective name')."""
    lowered = name.lower()
    for prefix in _COLLECTIVE_PREFIXES:
        if lowered.startswith(prefix):
            lowered = lowered[len(prefix):]
            break
    compact = lowered.strip("_").replace("_", "")
    for prefix, kind in _TYPE_PREFIXES:
        if compact.startswith(prefix):
            return kind
    for prefix, kind in _TYPE_PREFIXES[:6]:
        if prefix in compact:
            return kind
    if any(part in compact for part in _EXPERT_PARALLEL):
        return "all_to_all"
    return "other"


CACHE_LOOKUP = "TorchDynamo Cache Lookup"  # dynamo's guard check before each compiled call
AOT_FORWARD = "CompiledFunction"  # AOTAutograd's forward graph (CompiledFunctionBackward its backward)
_COMPILE_ID = re.compile(r"compile_id=(\d+)/(\d+)")


def compiled_regions(trace: Trace, events: np.ndarray) -> dict[int, tuple[str, str]]:
    """Name id -> (frame N, compile id M) of the ``Torch-Compiled Region: N/M`` names among ``events``, by id."""
    found = {}
    for i in names_where(trace, COMPILED_REGION.match, events):
        frame, attempt = COMPILED_REGION.match(trace.names[i]).groups()
        found[i] = (frame, attempt)
    return found


def compile_ids(trace: Trace, events: np.ndarray) -> list[tuple[str, str]]:
    """The (N, M) of every ``compile_id=N/M`` the names of ``events`` carry."""
    return [_COMPILE_ID.search(trace.names[i]).groups() for i in names_where(trace, _COMPILE_ID.search, events)]


def is_triton_kernel(name: str) -> bool:
    """A kernel Triton generated (torch.compile's inductor names them ``triton_...``)."""
    return name.startswith("triton_")


_GRAPH = re.compile(r"^## Call CompiledFxGraph (\w+) ##$")  # inductor's generated graph, by its hash


def compiled_graphs(trace: Trace, events: np.ndarray) -> dict[int, str]:
    """Name id -> hash of the ``## Call CompiledFxGraph HASH ##`` names among ``events``, by id."""
    return {i: _GRAPH.match(trace.names[i]).group(1) for i in names_where(trace, _GRAPH.match, events)}


# common/types.py:129 of HTA (ComputeKernelGroupingPattern, inverse match), kept verbatim.
_HTA_NON_COMPUTE = re.compile(
    r"(^nccl)|(.*Memcpy)|(.*Memset)|(.*dma)|(^.*Sync)|(^Stream Wait Event)|(cuda.*LaunchKernel)|(^runFunction)"
    r"|(^hip)|(^job_exe)|(^packet)|(^pe_exe)|(^cpum_exe_subgraph)|(^hccl)|(^collective_subgraph_execution)"
)


def is_hta_compute(name: str) -> bool:
    """A compute kernel by HTA's name rule (not a collective, copy, memset, sync...)."""
    return _HTA_NON_COMPUTE.match(name) is None
