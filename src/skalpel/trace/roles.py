"""Event roles: what each event is for, decided once from its kind and name, at the trace's first use.

``kinds.py`` says what an event is in the profiler's terms (a host op, a launch call, a kernel);
a role says what it means for a training step: waiting for data, an optimizer step, a backward
node, a sync the user wrote, a pageable copy, a graph launch, a compiled region, compiling, a
collective, the profiler's own work. Every analysis and rule that needs one of these reads the
``Trace.role`` column (and ``Trace.phase`` for forward / backward / optimizer), so each fact has
one definition and no other module tests an event's name.

Names are tested once per distinct name, never per event: a trace of a million events has a
few thousand names.
"""

from __future__ import annotations

import enum
import re

import numpy as np

from .kinds import Kind

# Names are public: analyses and rules may print them, never test names against them.
SYNC_CALLS = frozenset(
    {
        "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaThreadSynchronize",
        "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize",
        "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize",
    }
)  # fmt: skip
SYNC_COPY_CALLS = frozenset({"cudaMemcpy", "hipMemcpy", "cuMemcpyDtoH", "cuMemcpyDtoH_v2", "cudaMemcpy2D"})
ITEM_OPS = frozenset({"aten::item", "aten::_local_scalar_dense"})
ALLOCATOR_CALLS = frozenset(
    {"cudaMalloc", "cudaFree", "hipMalloc", "hipFree", "cuMemAlloc", "cuMemAlloc_v2", "cuMemFree", "cuMemFree_v2",
     "hipExtMallocWithFlags", "cudaMallocManaged", "hipMallocManaged"}
)  # fmt: skip
OPTIMIZER_PREFIX = "Optimizer.step#"  # torch.optim's record_function around each optimizer step
ZERO_GRAD_PREFIX = "Optimizer.zero_grad#"
BACKWARD_PREFIX = "autograd::engine::evaluate_function:"  # one per backward node run
CLOSING_RANGE = "skalpel: closing the recording"  # skalpel's own work in the last recorded step
PROFILER_FRAMES = ("torch/profiler/profiler.py(", "torch/autograd/profiler.py(")
COMPILE_TOP = ("dynamo", "entire_frame_compile")  # one range per torch.compile compilation
COMPILE_RANGE = re.compile(
    r"^dynamo$|^entire_frame_compile$|\(dynamo_timed\)$|^_compile\b|^compile_fx|^Compile\b"
    r"|^OutputGraph\.(call_user_compiler|compile_and_call_fx_graph)$|^(inductor|backend)_compile$"
    r"|^create_aot_dispatcher_function$|^GraphLowering\.|^async_compile\.wait$"
)
# The same compilation seen in Python stacks (with_stack): dynamo's and inductor's compile functions, by file.
# Only functions that run while compiling: compile_fx.py's ``wrapper`` and standalone_compile's ``__call__``
# run compiled code (vLLM's traces are full of them).
COMPILE_FRAME = re.compile(
    r"torch[/\\](?:_dynamo[/\\](?:convert_frame\.py\(\d+\): (?:_compile|compile_inner)"
    r"|output_graph\.py\(\d+\): (?:call_user_compiler|compile_and_call_fx_graph))"
    r"|_inductor[/\\]compile_fx\.py\(\d+\): (?:compile_fx|compile_fx_inner|_compile_fx_inner|fw_compiler_base)"
    r"|_functorch[/\\]aot_autograd\.py\(\d+\): create_aot_dispatcher_function)$"
)
COMPILED_REGION = re.compile(r"^Torch-Compiled Region: (\d+)/(\d+)")
AOT_FUNCTIONS = frozenset({"CompiledFunction", "CompiledFunctionBackward"})
# ops whose first call sets up a library: cuDNN/MIOpen's algorithm search (convolutions), cuBLAS's handle and
# workspace (matmuls), the attention backends' kernels; one such call far slower than its kernels is one-time work
FIRST_USE_SETUP = re.compile(r"conv|cudnn|miopen|^aten::(linear|addmm|mm|bmm|matmul|baddbmm|_scaled_dot_product)")


def sets_up_on_first_use(name: str) -> bool:
    """An op whose first call initialises a library (cuDNN, cuBLAS): slow once, fast after."""
    return bool(FIRST_USE_SETUP.search(name))


class Role(enum.IntEnum):
    """What an event is for. One role an event; NONE for the ordinary work of the model."""

    NONE = 0
    DATA_WAIT = 1  # a DataLoader iterator's __next__ or a DataPipe iteration: the wait for the next batch
    DATA_OTHER = 2  # other DataLoader ranges (creating the iterator): not a wait for a batch
    OPTIMIZER_STEP = 3  # Optimizer.step#...
    ZERO_GRAD = 4  # Optimizer.zero_grad#...
    BACKWARD_NODE = 5  # autograd::engine::evaluate_function: one backward node
    USER_SYNC = 6  # a synchronising runtime call the user's code made (cudaStreamSynchronize, ...)
    INTERNAL_SYNC = 7  # a synchronisation the profiler made itself (its stop drains the device)
    SYNC_COPY = 8  # a synchronous copy call (cudaMemcpy): returns when the copy is done
    ITEM = 9  # aten::item / aten::_local_scalar_dense: a tensor's value read on the host
    PAGEABLE_DTOH = 10  # a device-to-host copy into pageable memory (blocks the host)
    PAGEABLE_HTOD = 11  # a host-to-device copy from pageable memory (pin_memory off)
    GRAPH_LAUNCH = 12  # cudaGraphLaunch / hipGraphLaunch: one call runs a recorded graph
    LAUNCH = 13  # other launch calls (cudaLaunchKernel, cuLaunchKernel, async copies and memsets)
    ALLOCATOR = 14  # cudaMalloc / cudaFree and their twins: the caching allocator's misses
    COMPILED_REGION = 15  # a compiled graph running (Torch-Compiled Region, CompiledFunction)
    COMPILE = 16  # torch.compile compiling: dynamo / inductor ranges and frames
    COLLECTIVE = 17  # a collective: host op (nccl:, gloo:, c10d::) or kernel (NCCL, RCCL, all-to-all, expert dispatch)
    PROFILER = 18  # the profiler's own work: its overhead spans, its Python frames, skalpel's closing range
    MODULE = 19  # nn.Module: Name ranges and frames (with_modules, with_stack)


SYNC_ROLES = (Role.USER_SYNC, Role.SYNC_COPY)  # the syncs the user's code made: a sync call, a synchronous copy
_LAUNCH_KINDS = (Kind.RUNTIME, Kind.DRIVER)
_LAUNCH_PARTS = ("LaunchKernel", "LaunchCooperativeKernel", "GraphLaunch", "MemcpyAsync", "MemcpyWithStream", "MemsetAsync")


def is_launch_call(name: str) -> bool:
    """A runtime or driver call that queues device work (a kernel, a graph, an async copy or memset)."""
    return any(part in name for part in _LAUNCH_PARTS)


def _host_range_role(name: str) -> Role:
    if name.startswith(("enumerate(DataLoader)#", "enumerate(DataPipe)#")):
        data_wait = name.startswith("enumerate(DataPipe)#") or name.endswith(".__next__")
        return Role.DATA_WAIT if data_wait else Role.DATA_OTHER
    if name.startswith("enumerate(DataLoader)"):
        return Role.DATA_OTHER
    if name.startswith(OPTIMIZER_PREFIX):
        return Role.OPTIMIZER_STEP
    if name.startswith(ZERO_GRAD_PREFIX):
        return Role.ZERO_GRAD
    if name.startswith(BACKWARD_PREFIX):
        return Role.BACKWARD_NODE
    if name in ITEM_OPS:
        return Role.ITEM
    if COMPILED_REGION.match(name) or name in AOT_FUNCTIONS:
        return Role.COMPILED_REGION
    if COMPILE_RANGE.search(name):
        return Role.COMPILE
    if name == CLOSING_RANGE or name.startswith("skalpel: "):
        return Role.PROFILER
    if name.startswith("nn.Module: "):
        return Role.MODULE
    return Role.NONE


def _runtime_role(name: str) -> Role:
    if name in SYNC_CALLS:
        return Role.USER_SYNC
    if name in SYNC_COPY_CALLS:
        return Role.SYNC_COPY
    if name in ALLOCATOR_CALLS:
        return Role.ALLOCATOR
    if "GraphLaunch" in name:
        return Role.GRAPH_LAUNCH
    if is_launch_call(name):
        return Role.LAUNCH
    return Role.NONE


def _copy_role(name: str) -> Role:
    if "Pageable" not in name:
        return Role.NONE
    if name.startswith("Memcpy DtoH"):
        return Role.PAGEABLE_DTOH
    if name.startswith("Memcpy HtoD"):
        return Role.PAGEABLE_HTOD
    return Role.NONE


def _python_role(name: str) -> Role:
    if name.startswith(PROFILER_FRAMES):
        return Role.PROFILER
    if COMPILE_FRAME.search(name):
        return Role.COMPILE
    if name.startswith("nn.Module: "):  # with_stack records each module call as such a frame
        return Role.MODULE
    return Role.NONE


_BY_KIND = {
    Kind.CPU_OP: _host_range_role,
    Kind.USER_ANNOTATION: _host_range_role,
    Kind.DATALOADER: _host_range_role,
    Kind.RUNTIME: _runtime_role,
    Kind.DRIVER: _runtime_role,
    Kind.MEMCPY: _copy_role,
    Kind.PYTHON: _python_role,
}
_FIXED = {Kind.COMM_OP: Role.COLLECTIVE, Kind.COMM_KERNEL: Role.COLLECTIVE, Kind.OVERHEAD: Role.PROFILER}


def event_roles(names: list[str], kind: np.ndarray, name: np.ndarray, rank: np.ndarray, tid: np.ndarray,
                ts: np.ndarray, end: np.ndarray) -> np.ndarray:  # fmt: skip
    """The role of every event (int8), from its kind and its name (each distinct name tested once)."""
    roles = np.zeros(len(kind), dtype=np.int8)
    for event_kind, role in _FIXED.items():
        roles[kind == event_kind] = role
    for event_kind, role_of in _BY_KIND.items():
        events = np.flatnonzero(kind == event_kind)
        if len(events) == 0:
            continue
        ids, inverse = np.unique(name[events], return_inverse=True)
        table = np.array([int(role_of(names[int(i)])) for i in ids], dtype=np.int8)
        found = table[inverse]
        if event_kind in (Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.DATALOADER):
            found = np.where(found == Role.NONE, roles[events], found)  # a COMM_OP keeps COLLECTIVE
        roles[events] = found
    _profiler_syncs(roles, kind, rank, tid, ts, end)
    return roles


def _profiler_syncs(roles, kind, rank, tid, ts, end) -> None:
    """A sync call inside the profiler's own Python frames is the profiler's (its stop drains the device), not the
    user's: INTERNAL_SYNC. A capture has one or two such frames, its start and its stop."""
    syncs = np.flatnonzero(roles == Role.USER_SYNC)
    frames = np.flatnonzero((roles == Role.PROFILER) & (kind == Kind.PYTHON))
    for frame in frames.tolist():
        inside = (rank[syncs] == rank[frame]) & (tid[syncs] == tid[frame]) & (ts[syncs] >= ts[frame])
        inside &= end[syncs] <= end[frame]
        roles[syncs[inside]] = Role.INTERNAL_SYNC


class Phase(enum.IntEnum):
    """Which part of a training iteration a host event runs in, by the ranges around it on its thread."""

    NONE = 0  # not inside a recognised phase (forward work, or outside any step)
    FORWARD = 1  # a module's forward inside an optimizer step (an LBFGS closure); elsewhere forward work is NONE
    BACKWARD = 2  # inside a backward node
    OPTIMIZER = 3  # inside Optimizer.step or zero_grad
    DATA = 4  # inside a DataLoader fetch


_PHASE_ORDER = (Phase.OPTIMIZER, Phase.DATA, Phase.BACKWARD)  # outer to inner where they nest
_PHASE_OF = {Role.BACKWARD_NODE: Phase.BACKWARD, Role.OPTIMIZER_STEP: Phase.OPTIMIZER, Role.ZERO_GRAD: Phase.OPTIMIZER,
             Role.DATA_WAIT: Phase.DATA}  # fmt: skip


def event_phases(roles: np.ndarray, kind: np.ndarray, rank: np.ndarray, tid: np.ndarray, ts: np.ndarray,
                 end: np.ndarray) -> np.ndarray:  # fmt: skip
    """The phase of every host event: that of the innermost phase range around it on its thread (a backward node
    inside an optimizer step, an LBFGS closure, is backward). Device events and events in no such range: NONE."""
    phases = np.zeros(len(roles), dtype=np.int8)
    host = np.flatnonzero(np.isin(kind, [Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.DATALOADER, Kind.COMM_OP, Kind.RUNTIME,
                                         Kind.DRIVER, Kind.PYTHON]))  # fmt: skip
    if len(host) == 0:
        return phases
    # the innermost phase wins, set last: a backward node inside an LBFGS step (its closure) is backward work
    for role, phase in sorted(_PHASE_OF.items(), key=lambda item: _PHASE_ORDER.index(item[1])):
        ranges = np.flatnonzero(roles == role)
        if len(ranges) == 0:
            continue
        _mark_inside(phases, host, ranges, int(phase), rank, tid, ts, end)
    _closure_forward(phases, roles, host, rank, tid, ts, end)
    return phases


def _closure_forward(phases, roles, host, rank, tid, ts, end) -> None:
    """A module called inside an optimizer step runs the model's forward (LBFGS calls the closure, which runs the
    forward and the backward, several times a step): its work is forward, not the optimizer's update. Only
    optimizer-phase events change: the closure's backward stays backward, its zero_grad the optimizer's."""
    modules = np.flatnonzero((roles == Role.MODULE) & (phases == Phase.OPTIMIZER))
    if len(modules) == 0:
        return
    optimizer = host[phases[host] == Phase.OPTIMIZER]
    inside = np.zeros(len(phases), dtype=np.int8)
    _mark_inside(inside, optimizer, modules, 1, rank, tid, ts, end)
    zero_grads = np.flatnonzero(roles == Role.ZERO_GRAD)
    if len(zero_grads):  # a module's hook that zeroes grads: the optimizer's still
        _mark_inside(inside, optimizer, zero_grads, 0, rank, tid, ts, end)
    phases[inside == 1] = Phase.FORWARD


def _mark_inside(phases, host, ranges, phase, rank, tid, ts, end) -> None:
    """Set ``phase`` on the host events lying inside any of ``ranges`` on the same thread."""
    key_host = rank[host].astype(np.int64) * (1 << 40) + tid[host]
    key_ranges = rank[ranges].astype(np.int64) * (1 << 40) + tid[ranges]
    for key in sorted(set(key_ranges.tolist())):  # a few threads (np.unique would import numpy.ma)
        mine = ranges[key_ranges == key]
        order = np.argsort(ts[mine], kind="stable")
        starts, ends = ts[mine][order], end[mine][order]
        ends = np.maximum.accumulate(ends)  # nested ranges: the outer range's end holds
        events = host[key_host == key]
        position = np.searchsorted(starts, ts[events], side="right") - 1
        inside = (position >= 0) & (end[events] <= ends[np.maximum(position, 0)] + 1e-9)
        phases[events[inside]] = phase
