"""Op-specific knowledge of event names that is not a role: which copies go device to host, which kernels Triton
generated, which aten ops have a FLOP formula, a collective's type, a DataLoader's iterator, the attention ops and
SDPA's backend. Analyses ask here, by name id, and never test a
name themselves; each helper tests each distinct name once, never each event.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable

import numpy as np

from .columns import ELEMENTWISE_TYPED, SOFTMAX_TYPED
from .kinds import Kind
from .model import Trace
from .roles import COMPILED_REGION, OPTIMIZER_PREFIX


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


def id_of(trace: Trace, name: str) -> int:
    """The id of ``name`` (one of this module's names), or -1 when no event has it."""
    return trace.name_id(name)


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
# expert parallelism's all-to-all written as kernels of its own: DeepEP's and pplx's dispatch and combine, and the
# notify kernels (notify_dispatch, cached_notify) that exchange its layout between the ranks
_EXPERT_PARALLEL = ("dispatch", "combine", "all2all", "a2a", "notify")


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


def kernel_stem(name: str) -> str:
    """A kernel's name without its template and argument lists: 'void ns::f<float>(int)' -> 'ns::f'."""
    cut = min((p for p in (name.find("<"), name.find("(")) if p > 0), default=len(name))
    return name[:cut].removeprefix("void ").strip() or name


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


# Ops with a FLOP formula from their 'Input Dims' (torch's with_flops counts them the same way).
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
# The (batch, heads, length, dim) entry points only: the kernels' own ops below them would count twice.
ATTENTION_OPS = ("aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
                 "aten::_scaled_dot_product_cudnn_attention")  # fmt: skip
CONVOLUTION, CONVOLUTION_BACKWARD = "aten::convolution", "aten::convolution_backward"


def flop_formula_ops(trace: Trace) -> dict[int, str]:
    """Name id -> name of the matmul and attention ops the trace has, whose FLOPs ``flops_from_shapes`` counts."""
    return {i: name for name in (*MATMUL_OPS, *ATTENTION_OPS) if (i := trace.name_id(name)) >= 0}


def is_convolution_like(name: str) -> bool:
    """Any op with "conv" in its name: a trace that counted one's FLOPs itself counted its convolutions."""
    return "conv" in name


def flops_from_shapes(name: str, dims_json: str) -> float | None:
    """FLOPs of one call from its 'Input Dims', as torch's with_flops counts them; 0 when the shapes do not fit
    (too few inputs), None when the field is not a list of lists of numbers."""
    try:
        dims = json.loads(dims_json)
    except ValueError:
        return None
    if not isinstance(dims, list):
        return None
    shapes = [shape for shape in dims if isinstance(shape, list)]
    if any(isinstance(size, bool) or not isinstance(size, (int, float)) for shape in shapes for size in shape):
        return None
    try:
        if name in ("aten::mm", "aten::addmm"):
            a, b = (shapes[1], shapes[2]) if name == "aten::addmm" else (shapes[0], shapes[1])
            return 2.0 * a[0] * a[1] * b[1]
        if name in ("aten::bmm", "aten::baddbmm"):
            a, b = (shapes[1], shapes[2]) if name == "aten::baddbmm" else (shapes[0], shapes[1])
            return 2.0 * a[0] * a[1] * a[2] * b[2]
        q, k = shapes[0], shapes[1]  # (batch, heads, length, dim) x (batch, heads, source length, dim)
        return 4.0 * q[0] * q[1] * q[2] * k[2] * q[3]
    except IndexError:
        return 0.0


# One-time work (analysis/onetime.py): the calls that set a device up, those long because they wait, and those that
# load a kernel's module on its first launch.
_SETUP_CALLS = (
    "cuInit", "cuDevicePrimaryCtxRetain", "cuCtxCreate", "cudaFree", "cudaSetDevice", "cudaGetDeviceCount",
    "cudaGetDevice", "cudaGetDeviceProperties", "cudaStreamIsCapturing", "cudaDeviceGetAttribute", "cudaMalloc",
    "hipInit", "hipFree", "hipSetDevice", "hipGetDeviceCount", "hipGetDeviceProperties", "hipMalloc",
)  # fmt: skip
_WAITS = ("Synchronize", "Memcpy", "StreamWait", "EventQuery", "EventRecord")  # long because they wait, not set up
_LAUNCHES = ("LaunchKernel", "LaunchCooperativeKernel", "ModuleLaunchKernel", "ModuleLoad")


def is_setup_call(name: str) -> bool:
    """A call that creates the device context or sets the device up (slow once, by design)."""
    return name.startswith(_SETUP_CALLS)


def is_waiting_call(name: str) -> bool:
    """A call long because it waits for the device (a synchronize, a copy, an event query), not because it sets up."""
    return any(part in name for part in _WAITS)


def is_kernel_load_call(name: str) -> bool:
    """A launch or module load: slow the first time when its module loads lazily or compiles."""
    return name.endswith(_LAUNCHES)


def is_cudnn_like(name: str) -> bool:
    """A cuDNN / MIOpen call or a convolution op: its first call searches algorithms."""
    lowered = name.lower()
    return "cudnn" in lowered or "miopen" in lowered or "conv" in lowered


def is_capture_begin(name: str) -> bool:
    """cudaStreamBeginCapture and its twins: launches after it are recorded into a CUDA graph, not run."""
    return name.endswith("StreamBeginCapture")


def is_capture_end(name: str) -> bool:
    return name.endswith("StreamEndCapture")


# Host-side signs that a run used a GPU even where no device event was recorded (activities=[CPU] only).
_GPU_OP = re.compile(r"cudnn|miopen|cublas|\bcuda\b|_cuda|nccl:|^cuda|^hip|^cu[A-Z]", re.I)


# Ops that ask whether a GPU library applies, and run on a CPU-only run too (every nn.LSTM and GRU calls
# aten::cudnn_is_acceptable on the CPU): no sign of a GPU.
_ASKS_ABOUT_GPU = re.compile(r"cudnn_is_acceptable|_use_cudnn|_use_miopen|is_available", re.I)


def is_gpu_op(name: str) -> bool:
    """A host op or call that only a GPU run makes (cuDNN, cuBLAS, CUDA, HIP, NCCL)."""
    return _GPU_OP.search(name) is not None and _ASKS_ABOUT_GPU.search(name) is None


def is_hip_call(name: str) -> bool:
    """A ROCm runtime call."""
    return name.startswith("hip")


def is_cuda_call(name: str) -> bool:
    """A CUDA runtime or driver call."""
    return name.startswith("cu")


def is_aten_op(name: str) -> bool:
    return name.startswith("aten::")


# --- the DataLoader ------------------------------------------------------------------------


def loader_iterator(name: str) -> str:
    """The iterator type of a DataLoader range: ``enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__`` ->
    ``_SingleProcessDataLoaderIter``."""
    return name.split("#", 1)[-1].split(".")[0]


def single_process(iterator: str) -> bool:
    """The iterator of a DataLoader with num_workers=0: every batch is made in the training process."""
    return "SingleProcess" in iterator


# --- attention ------------------------------------------------------------------------------

SDPA = "aten::scaled_dot_product_attention"
ATTENTION_MATMUL = frozenset({"aten::bmm", "aten::baddbmm"})
SOFTMAX = frozenset({"aten::_softmax", "aten::_safe_softmax", "aten::softmax"})
_FUSED_OPS = ("flash_attention", "efficient_attention", "cudnn_attention", "_fused_attention", "flex_attention")
_FUSED_KERNELS = ("flash", "fmha", "attn_fwd", "attn_bwd", "efficient_attention", "fused_attention")
_SDPA_BACKENDS = (  # (part of the inner op's name, backend)
    ("attention_math", "math (eager fallback)"),
    ("efficient_attention", "memory-efficient"),
    ("flash_attention", "flash"),
    ("cudnn_attention", "cuDNN"),
)
SLOWER_THAN_FLASH = ("math (eager fallback)", "memory-efficient")  # the math path keeps the whole score matrix


def sdpa_backend(inner: Iterable[str]) -> str:
    """The backend an SDPA call ran, from the names of the ops inside it; "unknown" when none names one."""
    names = list(inner)
    for part, backend in _SDPA_BACKENDS:
        if any(part in name for name in names):
            return backend
    return "unknown"


def fused_attention_op(name: str) -> bool:
    return any(part in name for part in _FUSED_OPS)


def fused_attention_kernel(name: str) -> bool:
    return any(part in name.lower() for part in _FUSED_KERNELS)


# --- copies ---------------------------------------------------------------------------------

COPY_OPS = frozenset({"aten::to", "aten::_to_copy", "aten::copy_", "aten::cpu", "aten::numpy_T"})


def memcpy_calls(trace: Trace, events: np.ndarray) -> np.ndarray:
    """Which of these events are copies by name (``cudaMemcpy``, ``Memcpy DtoH (Device -> Pageable)``, ...)."""
    ids, inverse = np.unique(trace.name[events], return_inverse=True)
    return np.array(["Memcpy" in trace.names[int(i)] for i in ids], dtype=bool)[inverse].reshape(len(events))


def named(trace: Trace, names: Iterable[str]) -> np.ndarray:
    """Mask of the events with one of these names."""
    ids = ids_of(trace, names)
    return np.isin(trace.name, ids) if ids else np.zeros(len(trace), dtype=bool)


# --- an LBFGS step, a broadcast view, a loss that keeps its buffer, c10d's ops ---------------------

LBFGS_STEP = OPTIMIZER_PREFIX + "LBFGS.step"  # torch.optim.LBFGS's step: it makes its curvature history inside
EXPAND_OPS = ("aten::expand", "aten::expand_as", "aten::broadcast_to")  # a broadcast view, free until materialised
# reduced losses whose 0-dim result keeps the whole elementwise-loss buffer as its storage (pytorch/pytorch#185647)
LOSS_KEEPS_BUFFER = frozenset({"aten::mse_loss", "aten::smooth_l1_loss"})


def lbfgs_steps(trace: Trace, rank: int) -> np.ndarray:
    """The LBFGS optimizer steps of a rank, by start (empty without one)."""
    ranges = np.flatnonzero(named(trace, (LBFGS_STEP,)) & (trace.rank == rank))
    return ranges[np.argsort(trace.ts[ranges], kind="stable")]


def expand_ops(trace: Trace) -> np.ndarray:
    """A mask of the events that are broadcast views (aten::expand, expand_as, broadcast_to)."""
    return named(trace, EXPAND_OPS)


def keeps_loss_buffer(op: str) -> bool:
    return op in LOSS_KEEPS_BUFFER


def c10d_ops(trace: Trace, rank: int) -> np.ndarray:
    """A rank's c10d collective ops (host side), in event order."""
    issued = np.flatnonzero((trace.kind == Kind.COMM_OP) & (trace.rank == rank))
    ids = names_where(trace, is_c10d_collective, issued)
    return issued[np.isin(trace.name[issued], ids)] if ids else issued[:0]


# torch's reference kernels, run when no library path takes an op (diagnose/hot_op.py): on torch 2.13's CPU a float64
# convolution runs _slow_conv2d_*, slow_conv_dilated2d or slow_conv_transpose2d, a float32 one oneDNN's kernel.
FALLBACK_KERNELS = frozenset({
    "aten::_slow_conv2d_forward", "aten::_slow_conv2d_backward", "aten::thnn_conv2d", "aten::slow_conv3d_forward",
    "aten::slow_conv3d", "aten::slow_conv_dilated2d", "aten::slow_conv_dilated3d", "aten::slow_conv_transpose2d",
    "aten::slow_conv_transpose3d",
})  # fmt: skip

# Matrix multiplies and convolutions on their library kernels: a step they dominate is the model's own compute.
COMPUTE_KERNELS = frozenset({
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear", "aten::addmv",
    "aten::mv", "aten::dot", "aten::_addmm_activation", "aten::mkldnn_convolution", "aten::convolution_backward",
    "aten::mkldnn_linear", "aten::mkldnn_rnn_layer", "aten::mkldnn_rnn_layer_backward", "aten::_mkldnn_transpose",
    "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
})  # fmt: skip


def is_reference_kernel(name: str) -> bool:
    """torch's reference (fallback) implementation of an op that a library kernel normally takes."""
    return name in FALLBACK_KERNELS


def is_library_compute(name: str) -> bool:
    """A matrix multiply or convolution on its library kernel (oneDNN, BLAS, CPU flash attention)."""
    return name in COMPUTE_KERNELS


# fp32 GEMMs on the CUDA cores (no TF32, no tensor cores): cuBLAS's SIMT kernels by architecture, cutlass's simt ones,
# Hopper's xmma f32 GEMMs without tf32. Tensor-op fp32 GEMMs (cutlass tensorop_s1688, *_tf32*) already run TF32.
FP32_SIMT_GEMM = re.compile(r"(?:^|[^a-z0-9])(?:maxwell|pascal|volta|turing|ampere|ada|sm\d+)_sgemm_"
                            r"|cutlass_\d+_simt_sgemm|xmma_gemm_f32f32_f32f32_f32")  # fmt: skip


def is_fp32_simt_gemm(name: str) -> bool:
    """A kernel that runs an fp32 GEMM on the CUDA cores (no TF32)."""
    return bool(FP32_SIMT_GEMM.search(name))


def roofline_kinds(trace: Trace) -> dict[int, str]:
    """Name id -> "matmul", "convolution", "elementwise" or "softmax" for the ops the roofline judges (their
    input dtypes are kept by the loader, ``columns.TYPED_OPS``)."""
    kinds = {}
    for names, kind in ((MATMUL_OPS, "matmul"), ((CONVOLUTION,), "convolution"), (ELEMENTWISE_TYPED, "elementwise"),
                        (SOFTMAX_TYPED, "softmax")):  # fmt: skip
        kinds.update((found, kind) for found in ids_of(trace, names))
    return kinds
