"""Look-alike traces for the failure classes of issue 33 (one ledger), each a planted case and its quiet twin.

Every builder writes today's Kineto schema through ``tests/tracebuilder.py`` and returns one
``TraceBuilder`` (one rank) or a list of them (one per rank, each with its ``distributedInfo``).
Its docstring says the shape and what an engineer would conclude from it; ``CASES`` pairs each
planted case with its twin and says what each must (and must not) get. The traces are small (a
few hundred events), deterministic, and the numbers quoted in the docstrings are the ones
``skalpel analyze`` prints on them (step breakdown, rank panel).

``benchmarks/lookalike_verdicts.py`` prints skalpel's verdict on each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.tracebuilder import TraceBuilder, cpu_rank, gpu_rank

LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
MIB = 2**20
GEMM = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
        "__5x_cublas")
ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>(int, ...)"


def write(trace: TraceBuilder | list[TraceBuilder], folder: Path, name: str) -> Path:
    """One rank: ``folder/name.json``; several: ``folder/name/rank{r}.json``, the folder returned for ``analyze``."""
    if isinstance(trace, TraceBuilder):
        return trace.write(folder / f"{name}.json")
    job = folder / name
    job.mkdir(parents=True, exist_ok=True)
    for rank, builder in enumerate(trace):
        builder.write(job / f"rank{rank}.json")
    return job


# --- 1. no step markers, communication heavy --------------------------------------------------------


def _layers_with_collectives(rank: int, *, comm_us: float, overlapped: bool, layers: int = 8) -> TraceBuilder:
    """Eight layers of one GEMM and one all_reduce each, recorded without ProfilerStep markers: a hand-made
    ``with profile():`` around one iteration. The host runs ahead (it launches every 150 us); the device is busy
    throughout, on the compute stream (7) or NCCL's (20)."""
    builder = gpu_rank(rank)
    period = 5000.0
    builder.frame("train.py(88): train_step", 0, layers * 150 + 60)
    for layer in range(layers):
        host, device = layer * 150.0, 60.0 + layer * period
        external = builder.host("aten::mm", host, 40, **{"Input Dims": [[8192, 4096], [4096, 4096]]})
        if overlapped:  # the bucket of the layer before is reduced while this layer computes
            builder.launch(host + 10, 8, work_ts=device, work_dur=period - 10, external=external, kernel=GEMM)
            builder.nccl(host + 60, work_ts=device + 1000, work_dur=comm_us, nelems=1 << 20)
        else:  # the all_reduce waits for the GEMM (cudaStreamWaitEvent): the streams take turns
            gemm_us = period - comm_us - 10
            builder.launch(host + 10, 8, work_ts=device, work_dur=gemm_us, external=external, kernel=GEMM)
            builder.runtime("cudaStreamWaitEvent", host + 55, 3)
            builder.nccl(host + 60, work_ts=device + gemm_us + 5, work_dur=comm_us, nelems=1 << 24)
    return builder


def unmarked_comm_heavy() -> list[TraceBuilder]:
    """Two NCCL ranks, one 40 ms window with no ProfilerStep: eight GEMMs, each followed by an all_reduce waiting for it.

    The all_reduce kernels hold 54% of the window (2.7 of every 5 ms) and never overlap compute (the rank panel:
    "communication (device): 53.9% of the step (21.60 ms/step), 100% not overlapped"). Engineer: communication-bound,
    nothing hides the all_reduces (bucketing, overlap with backward, a bigger batch): ``communication_bound`` and
    ``low_comm_overlap``, judged over the one window ("one 40 ms window, no steps marked").
    """
    return [_layers_with_collectives(rank, comm_us=2700, overlapped=False) for rank in (0, 1)]


def unmarked_comm_light() -> list[TraceBuilder]:
    """Twin of ``unmarked_comm_heavy``: the same window, all_reduces of 250 us (5%) each under a running GEMM.

    Engineer: compute-bound, communication hidden: no ``communication_bound``, no ``low_comm_overlap``.
    """
    return [_layers_with_collectives(rank, comm_us=250, overlapped=True) for rank in (0, 1)]


# --- 2. one-time work without a later repeat ----------------------------------------------------------

_FIRST_FORWARD = (  # op, host us, first-launch us (lazy module loading), kernel us: each op once
    ("aten::conv2d", 182_000, 0, 900),  # cuDNN's algorithm search inside, its one launch at the end
    ("aten::batch_norm", 600, 24_000, 300),
    ("aten::relu_", 300, 11_000, 150),
    ("aten::max_pool2d", 400, 9_000, 200),
    ("aten::adaptive_avg_pool2d", 350, 8_500, 120),
    ("aten::flatten", 40, 0, 0),
    ("aten::linear", 41_000, 0, 250),  # cuBLAS handle and workspace creation
    ("aten::softmax", 300, 7_500, 60),
    ("aten::argmax", 280, 6_000, 40),
)


def first_calls_only() -> TraceBuilder:
    """One GPU inference window (``with profile(): model(x)`` on a fresh process): nine ops, each called once.

    Slow because every call is a first: cuDNN's algorithm search in the conv2d (182 ms), cuBLAS set-up in the linear
    (41 ms), and the first launch of each kernel loading its module (6-24 ms, CUDA_MODULE_LOADING=LAZY). The kernels
    total 2 ms of a ~290 ms window. Engineer: all of it is one-time work (``cold_start``, critical); nothing to say
    about the steady state (no ``gpu_idle`` with a host cause, no ``launch_bound``, no ``host_device_sync``).
    """
    builder = TraceBuilder()
    builder.device_properties = [{"id": 0, "name": "NVIDIA A100-SXM4-40GB", "totalGlobalMem": 40 * 2**30}]
    ts = 0.0
    builder.frame("infer.py(14): <module>", 0, 300_000)
    for op, host_us, first_launch_us, kernel_us in _FIRST_FORWARD:
        duration = host_us + first_launch_us + 30
        external = builder.host(op, ts, duration)
        if kernel_us:
            launch_at = ts + duration - first_launch_us - 20
            builder.launch(launch_at, first_launch_us or 12, work_ts=launch_at + (first_launch_us or 12) + 8,
                           work_dur=kernel_us, external=external, kernel=f"first_kernel_of_{op[6:]}")  # fmt: skip
        ts += duration + 25
    return builder


def cuda_only_first_launch() -> TraceBuilder:
    """A capture with ``activities=[CUDA]`` only (runtime and driver calls, kernels; no cpu_op, no step) of a
    torch.compile'd model: its Triton kernels go through cuLaunchKernel, and the one eager kernel (a cuBLAS GEMM)
    through cudaLaunchKernel, once.

    That one cudaLaunchKernel takes 5.5 s (the first use of the library: its module loaded lazily); 60 Triton launches
    of 6 us follow, each queueing a 400 us kernel, then a cudaDeviceSynchronize. Engineer: the 5.5 s is one-time work
    (``cold_start``, critical); after it the device is busy; no steady-state finding about the 5.5 s (no
    ``launch_bound``, no ``gpu_idle`` blaming launches).
    """
    builder = TraceBuilder()
    builder.device_properties = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 80 * 2**30}]
    builder.launch(0, 5_500_000, work_ts=5_500_010, work_dur=400, kernel=GEMM)
    ts = 5_500_020.0
    for index in range(60):
        builder.launch(ts, 6, work_ts=5_500_420 + index * 405, work_dur=400, name="cuLaunchKernel", api="cuda_driver",
                       kernel=f"triton_poi_fused_add_mul_{index % 6}")  # fmt: skip
        ts += 40
    builder.runtime("cudaDeviceSynchronize", ts, 5_500_420 + 60 * 405 - ts + 5)
    return builder


def _steps_with_allocator(*, init_free_ms: float, churn: bool, steps: int = 5) -> TraceBuilder:
    """Marked steps of 10 ms: nine addmm launching 9 ms of kernels, then loss.item(). ``init_free_ms``: the process's
    first CUDA call (cudaFree(0) creating the context) inside ProfilerStep#0 before its work; ``churn``:
    cudaMalloc/cudaFree pairs in every step (caching off), which hold the launches back 2 ms (seven kernels then)."""
    builder = TraceBuilder()
    builder.device_properties = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 80 * 2**30}]
    start = 0.0
    for number in range(steps):
        offset = init_free_ms * 1000.0 + 100 if number == 0 and init_free_ms else 0.0
        length = 10_000.0 + offset
        builder.step(number, start, length - 1)
        builder.frame("train.py(40): <module>", start + 1, length - 5)
        if offset:
            builder.runtime("cudaFree", start + 20, init_free_ms * 1000.0)
        ts = start + offset
        builder.frame("train.py(52): train_step", ts + 10, 9_900)
        first, kernels = (2_200, 7) if churn else (200, 9)
        if churn:
            for index in range(3):  # what PYTORCH_NO_CUDA_MEMORY_CACHING=1 makes every op do
                builder.runtime("cudaMalloc", ts + 30 + index * 700, 250)
                builder.runtime("cudaFree", ts + 400 + index * 700, 200)
        for index in range(kernels):
            external = builder.host("aten::addmm", ts + first + index * 60, 50)
            builder.launch(ts + first + 10 + index * 60, 8, work_ts=ts + first + 100 + index * 1_000, work_dur=990,
                           external=external, kernel=GEMM)  # fmt: skip
        sync = ts + first + kernels * 60 + 20
        builder.runtime("cudaStreamSynchronize", sync, ts + first + 100 + kernels * 1_000 - sync)  # loss.item()
        start += length
    return builder


def init_cudafree_then_steps() -> TraceBuilder:
    """Five marked steps of 10 ms; ProfilerStep#0 opens with the process's first CUDA call, a 971 ms cudaFree (context
    creation), before the step's own work.

    Engineer: 971 ms of one-time work (``cold_start``; also a reason for ``no_warmup``); the steady state (steps 1-4,
    9 ms of kernels in 10 ms) has no problem. Not ``gpu_idle`` "host work before the next launch (cudaFree)", not
    ``allocator_churn``, no steady-state fix for the cudaFree.
    """
    return _steps_with_allocator(init_free_ms=971.0, churn=False)


def allocator_churn_every_step() -> TraceBuilder:
    """Twin of the one-time classes: the same steps with three cudaMalloc/cudaFree pairs in every step (1.35 ms of 10,
    the launches held back 2 ms).

    Engineer: real allocator churn in steady state: ``allocator_churn`` must still fire.
    """
    return _steps_with_allocator(init_free_ms=0.0, churn=True)


# --- 3. a main thread blocked in a collective ---------------------------------------------------------

CPU_STEP = 50_000.0


def _ddp_cpu_step(builder: TraceBuilder, number: int, *, wait_us: float, python_us: float) -> None:
    """One 50 ms step on the main thread (100): fetch, forward, backward (``## backward ##``), optimizer step.

    ``wait_us``: after the backward ops, the thread waits in DDP's reducer (finalize_backward) for the gradient
    all_reduce running on gloo's thread (200); nothing is recorded on the main thread meanwhile. ``python_us``:
    instead, user Python between the forward ops (augmentation of the batch: ``train.py(61): jitter``)."""
    start = number * CPU_STEP
    builder.step(number + 1, start, CPU_STEP - 10)
    builder.frame("train.py(70): <module>", start + 2, CPU_STEP - 20)
    builder.host(LOADER, start + 10, 300, cat="user_annotation")
    ts = start + 320
    for _ in range(4):
        if python_us:
            builder.frame("train.py(61): jitter", ts + 5, python_us / 4)
            ts += python_us / 4 + 10
        builder.host("aten::linear", ts, 1_400, **{"Input Dims": [[256, 1024], [1024, 1024], [1024]]})
        builder.host("aten::addmm", ts + 20, 1_360)
        ts += 1_420
    backward_start = ts + 10
    ts = backward_start + 10
    for _ in range(4):  # the backward nodes, last layer first
        builder.host("autograd::engine::evaluate_function: AddmmBackward0", ts, 800)
        builder.host("AddmmBackward0", ts + 10, 780)
        builder.host("aten::mm", ts + 20, 740)
        ts += 820
    if wait_us:
        builder.gloo_all_reduce(ts - 900, wait_us + 900, nelems=4 * 1024 * 1024 + 4 * 1024)  # the one DDP bucket
        ts += wait_us
    builder.host("## backward ##", backward_start, ts - backward_start + 20, cat="user_annotation")
    ts += 40
    builder.host("Optimizer.step#SGD.step", ts, 1_000, cat="user_annotation")
    for index in range(8):
        builder.host("aten::add_", ts + 10 + index * 120, 100)


def gloo_ddp_blocked_in_backward() -> list[TraceBuilder]:
    """Two gloo DDP ranks on CPUs: in each 50 ms step the main thread's backward waits 40 ms (80%) for the gradient
    all_reduce on gloo's thread; its own ops take under 20%.

    Engineer: the step is communication: a collective wait of 80% (a 16 MB all_reduce over gloo is slow: NCCL/fewer
    bytes/overlap, or bigger batches per sync). Not ``host_bound`` ("outside torch ops ... in ## backward ##" with a
    DataLoader-workers fix).
    """
    ranks = []
    for rank in (0, 1):
        builder = cpu_rank(rank)
        for number in range(5):
            _ddp_cpu_step(builder, number, wait_us=40_000, python_us=0)
        ranks.append(builder)
    return ranks


def python_busy_between_ops() -> TraceBuilder:
    """Twin of ``gloo_ddp_blocked_in_backward``: one CPU process, no collective; the main thread runs the user's
    Python (``train.py(61): jitter``, 36 ms) between the forward ops of each 50 ms step.

    Engineer: host-bound on the user's Python: ``host_bound`` naming ``jitter() in train.py:61``.
    """
    builder = TraceBuilder()
    builder.device_properties = []  # a CPU run
    for number in range(5):
        _ddp_cpu_step(builder, number, wait_us=0, python_us=36_000)
    return builder


# --- 4. expert-parallel all-to-all written as custom kernels --------------------------------------------
# DeepEP's intranode kernels (deepseek-ai/DeepEP csrc/kernels/intranode.cu) as CUPTI names them: demangled, with the
# template arguments (ranks, threads, TMA bytes per warp) and the parameter types.

EP_DISPATCH = ("void deep_ep::intranode::dispatch<4, 768, 8192>(int4*, float*, int*, long*, float*, int*, int*, "
               "int4 const*, float const*, long const*, float const*, bool const*, int const*, int, int, int, int, "
               "int, void**, int, int, int)")  # fmt: skip
EP_NOTIFY = ("void deep_ep::intranode::notify_dispatch<4>(int const*, int*, int const*, int*, int, int, int, "
             "bool const*, int*, int*, int, int, void**, int**, int, int)")  # fmt: skip
EP_COMBINE = ("void deep_ep::intranode::combine<__nv_bfloat16, 4, 768, 4096>(__nv_bfloat16*, float*, "
              "__nv_bfloat16 const*, float const*, __nv_bfloat16 const*, __nv_bfloat16 const*, int const*, int const*, "
              "int const*, int*, int, int, int, int, void**, int, int, int)")  # fmt: skip
GROUPED_GEMM = "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<...>>>"


def _moe_steps(builder: TraceBuilder, *, expert_parallel: bool, steps: int = 3) -> None:
    """Marked 20 ms steps of two MoE layers, forward and backward (four phases). Each phase: an attention GEMM
    (1.8 ms) then, with expert parallelism, DeepEP's notify_dispatch + dispatch (1.1 ms), the experts' grouped GEMM
    (0.9 ms) and DeepEP's combine (1.1 ms); without it the experts run locally (one grouped GEMM of 3.1 ms). DeepEP
    launches through cudaLaunchKernelExC from its pybind runtime: no aten op above its kernels. The step ends in a
    cudaStreamSynchronize (the loss)."""
    step_us = 20_000.0
    for number in range(steps):
        start = number * step_us
        builder.step(number + 1, start, step_us - 20)
        builder.frame("pretrain_moe.py(210): train_step", start + 5, step_us - 40)
        host, device = start + 20, start + 150
        for phase in ("forward", "forward", "backward", "backward"):
            if phase == "backward":
                builder.host("autograd::engine::evaluate_function: MoELayerBackward", host, 30)
                host += 40
            external = builder.host("aten::mm", host, 60)
            builder.launch(host + 10, 8, work_ts=device, work_dur=1_800, external=external, kernel=GEMM)
            device += 1_810
            host += 100
            kernels = ([(EP_NOTIFY, 100), (EP_DISPATCH, 1_000), (GROUPED_GEMM, 900), (EP_COMBINE, 1_100)]
                       if expert_parallel else [(GROUPED_GEMM, 3_100)])  # fmt: skip
            if phase == "backward" and expert_parallel:  # the gradient flows back: combine's backward is a dispatch
                kernels = [(EP_NOTIFY, 100), (EP_DISPATCH, 1_100), (GROUPED_GEMM, 900), (EP_COMBINE, 1_000)]
            for kernel, duration in kernels:
                if kernel == GROUPED_GEMM:
                    external = builder.host("aten::_grouped_mm", host, 50)
                    builder.launch(host + 10, 8, work_ts=device, work_dur=duration, external=external, kernel=kernel)
                else:
                    builder.frame("deep_ep/buffer.py(320): dispatch" if "dispatch" in kernel else
                                  "deep_ep/buffer.py(480): combine", host, 40)  # fmt: skip
                    builder.launch(host + 5, 9, work_ts=device, work_dur=duration, name="cudaLaunchKernelExC",
                                   kernel=kernel)  # fmt: skip
                device += duration + 10
                host += 70
        builder.runtime("cudaStreamSynchronize", host + 10, device - host - 5)


def moe_expert_parallel() -> list[TraceBuilder]:
    """Four ranks of an expert-parallel MoE job (``distributedInfo`` nccl, world 4) whose only communication is
    DeepEP's dispatch and combine kernels: no NCCL kernel, no ``nccl:``/``c10d::`` op in the window.

    Dispatch + combine take 44% of each 20 ms step (4 x 2.2 ms). Engineer: the job communicates, heavily
    (all-to-all): ``communication_bound`` counting dispatch/combine; never "the ranks never communicate: wrap it in
    DistributedDataParallel".
    """
    ranks = []
    for rank in range(4):
        builder = gpu_rank(rank, world_size=4)
        _moe_steps(builder, expert_parallel=True)
        ranks.append(builder)
    return ranks


def moe_single_process() -> TraceBuilder:
    """Twin of ``moe_expert_parallel``: one process, the experts local (grouped GEMMs only), no ``distributedInfo``.

    Engineer: a compute-bound single-GPU job: no communication finding, no "never communicates" note.
    """
    builder = TraceBuilder()
    builder.device_properties = [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 80 * 2**30}]
    _moe_steps(builder, expert_parallel=False)
    return builder


# --- 5. the DataLoader while the device drains the previous step -----------------------------------------


def _loader_steps(*, fetch_us: float, steps: int = 6) -> TraceBuilder:
    """Marked 40 ms steps: a fetch (``fetch_us``) in the training process, then ten ops each queueing a 3.2 ms kernel,
    launched faster than they run: each step's last kernels run into the next step's fetch."""
    builder = TraceBuilder()
    builder.device_properties = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 80 * 2**30}]
    step_us, kernel_us = 40_000.0, 3_200.0
    device_free = 0.0
    for number in range(steps):
        start = number * step_us
        builder.step(number + 1, start, step_us - 10)
        builder.frame("train.py(33): <module>", start + 2, step_us - 20)
        builder.host(LOADER, start + 5, fetch_us, cat="user_annotation")
        builder.frame("data.py(20): __getitem__", start + 8, fetch_us - 10)
        ts = start + fetch_us + 20
        gap = (step_us - fetch_us - 200) / 10
        for index in range(10):
            external = builder.host("aten::conv2d", ts, 60)
            launch = ts + 20
            work = max(launch + 30, device_free)
            builder.launch(launch, 8, work_ts=work, work_dur=kernel_us, external=external)
            device_free = work + kernel_us + 2
            ts += gap
    return builder


def loader_under_queued_work() -> TraceBuilder:
    """Six 40 ms steps whose fetch (12 ms, 30%, in the training process) starts while the device still runs ~4 ms of
    the previous step's queued kernels; the device idles for the rest of the fetch (~8 ms, ~20% of the step).

    Engineer: the host waits for data 30% of each step (the step's critical path): ``dataloader_bound`` at ~30%
    (``num_workers``), not ~20%.
    """
    return _loader_steps(fetch_us=12_000)


def loader_fast() -> TraceBuilder:
    """Twin of ``loader_under_queued_work``: a 1.2 ms fetch (3%). Engineer: no ``dataloader_bound``."""
    return _loader_steps(fetch_us=1_200)


# --- 6. host_bound on the profiler's own bookkeeping ----------------------------------------------------

_BLOCK = (  # one transformer block of a small CPU model, op and its time in us (record_shapes on)
    ("aten::layer_norm", 11), ("aten::linear", 16), ("aten::view", 3), ("aten::transpose", 3), ("aten::matmul", 12),
    ("aten::div", 5), ("aten::softmax", 8), ("aten::matmul", 11), ("aten::transpose", 3), ("aten::reshape", 4),
    ("aten::linear", 15), ("aten::dropout", 2), ("aten::add", 6), ("aten::layer_norm", 11), ("aten::linear", 16),
    ("aten::gelu", 8), ("aten::linear", 15), ("aten::dropout", 2), ("aten::add", 6),
)  # fmt: skip


def _cpu_forward(*, gap_us: float, python_us: float, blocks: int = 17) -> TraceBuilder:
    """One forward of a small transformer on the CPU, no steps: ``blocks`` blocks of 19 ops, ``gap_us`` between ops;
    ``python_us``: user Python (``model.py(77): route``) before each block's attention."""
    builder = TraceBuilder()
    builder.device_properties = []
    ts = 0.0
    builder.host("aten::embedding", ts, 20, **{"Input Dims": [[32000, 256], [4, 64]]})
    ts += 20 + gap_us
    for block in range(blocks):
        block_start = ts
        if python_us:
            builder.frame("model.py(77): route", ts, python_us)
            ts += python_us + gap_us
        for op, duration in _BLOCK:
            builder.host(op, ts, duration, **{"Input Dims": [[4, 64, 256]]})
            ts += duration + gap_us
        builder.frame("model.py(52): forward", block_start - 1, ts - block_start)
    builder.frame("infer.py(20): <module>", -2, ts + 4)
    return builder


def forward_with_bookkeeping_gaps() -> TraceBuilder:
    """One 4.9 ms CPU forward (``with profile(record_shapes=True, with_stack=True): model(x)``), no steps: 324 ops
    back to back with 7 us between them, what the profiler spends recording each op's shapes.

    46% of the window (2.3 ms) lies between ops, all of it bookkeeping. Engineer: no host-bound problem: no
    ``host_bound`` (at most a note that the window is one short forward dominated by the profiler's overhead).
    """
    return _cpu_forward(gap_us=7.0, python_us=0.0)


def forward_with_user_python() -> TraceBuilder:
    """Twin of ``forward_with_bookkeeping_gaps``: the same forward with the user's ``route()`` (Python, 500 us a
    block, no op inside) before each block: ~60% of the window in user Python between ops.

    Engineer: host-bound on ``route() in model.py:77``: ``host_bound`` must fire.
    """
    return _cpu_forward(gap_us=7.0, python_us=500.0)


# --- 7. numbers that cannot be: collectives overlapping each other ----------------------------------------


def _fsdp_steps(rank: int, *, overlapping: bool, steps: int = 4) -> TraceBuilder:
    """Marked steps of 20 ms: 6 ms of GEMMs on stream 7 and two collectives. ``overlapping``: FSDP's all_gather
    (stream 24, 12 ms) and reduce_scatter (stream 20, 13.5 ms) run at once for 6 ms: 25.5 ms of collective kernels
    in a 20 ms step (their union 19.5 ms); in the second step (the optimizer's, gradients reduced in full) the
    reduce_scatter runs 8 ms longer, and the step with it (28 ms). Otherwise an all_gather of 4 ms and a
    reduce_scatter of 4 ms, one after the other and after the GEMMs (8 ms, 40%)."""
    builder = gpu_rank(rank)
    start = 0.0
    for number in range(steps):
        longer = 8_000.0 if overlapping and number == 1 else 0.0
        step_us = 20_000.0 + longer
        builder.step(number + 1, start, step_us - 20)
        builder.frame("train_fsdp.py(120): train_step", start + 5, step_us - 40)
        if overlapping:
            builder.nccl(start + 10, work_ts=start + 300, work_dur=12_000, collective="all_gather", stream=24)
            external = builder.host("aten::mm", start + 60, 50)
            builder.launch(start + 70, 8, work_ts=start + 200, work_dur=6_000, external=external, kernel=GEMM)
            builder.nccl(start + 120, work_ts=start + 6_300, work_dur=13_500 + longer, collective="reduce_scatter")
        else:
            external = builder.host("aten::mm", start + 10, 50)
            builder.launch(start + 20, 8, work_ts=start + 200, work_dur=6_000, external=external, kernel=GEMM)
            builder.nccl(start + 80, work_ts=start + 6_300, work_dur=4_000, collective="all_gather", stream=24)
            builder.nccl(start + 140, work_ts=start + 10_400, work_dur=4_000, collective="reduce_scatter")
            external = builder.host("aten::add_", start + 200, 40)
            builder.launch(start + 210, 8, work_ts=start + 14_500, work_dur=5_300, external=external, kernel=ELEMENTWISE)
        builder.runtime("cudaStreamSynchronize", start + 300, step_us - 400)
        start += step_us
    return builder


def collectives_overlapping_each_other() -> list[TraceBuilder]:
    """Two NCCL ranks (FSDP-like), four steps: all_gather and reduce_scatter kernels on two streams overlap each other,
    25.5 ms of collective kernels per 20 ms step (union 19.5 ms, 97.5%); the second step is 28 ms, its reduce_scatter
    8 ms longer. The mean collective time a step (21.5 ms, union) is then more than the median step (20 ms): the rank
    panel prints "step ms 19.98, comm 21.50".

    Engineer: communication-bound (``communication_bound`` ~98%), and no number may say more collective ms per step
    than the step it is compared with (not "21.5 ms per step, median step 20.0 ms", nor types summing to 27.5 ms).
    """
    return [_fsdp_steps(rank, overlapping=True) for rank in (0, 1)]


def collectives_one_after_another() -> list[TraceBuilder]:
    """Twin of ``collectives_overlapping_each_other``: all_gather then reduce_scatter, 8 ms of a 20 ms step (40%).

    Engineer: ``communication_bound`` at 40% (8 ms per step), a figure no larger than the step.
    """
    return [_fsdp_steps(rank, overlapping=False) for rank in (0, 1)]


# --- 8. a GEMM library's scratch buffer --------------------------------------------------------------------


def _rest_of_the_model(builder: TraceBuilder, ts: float, *, work_ts: float) -> None:
    """Eight more ops, each queueing a 1.1 ms GEMM from ``work_ts``: the device busy to the end of the step."""
    for index in range(8):
        external = builder.host("aten::addmm", ts + index * 40, 30)
        builder.launch(ts + index * 40 + 10, 8, work_ts=work_ts + index * 1_110, work_dur=1_100, external=external,
                       kernel=GEMM)  # fmt: skip


def vit_block_with_cublas_workspace() -> TraceBuilder:
    """A ViT on an 80 GiB GPU, three marked steps: ``cls_token.expand(16, -1, -1)`` ([1, 1, 768] -> [16, 1, 768]),
    ``torch.cat`` with the patches, layer_norm, then the qkv linear (aten::linear -> aten::addmm, with bias) on
    [16, 197, 768]. Inside the addmm cuBLASLt takes a 76 MiB workspace from the caching allocator and gives it back
    before the addmm returns; the peak is 107 MiB (0.13% of the device).

    Engineer: an ordinary GEMM workspace, nothing materialised (the expand fed a cat of 16 x 768 elements): no
    ``memory_spike``, and above all no "materialises a broadcast".
    """
    builder = TraceBuilder()
    builder.device_properties = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 80 * 2**30}]
    base = 8 * MIB
    builder.memory(10, base, base, addr=1 << 32)  # the weights
    for number in range(3):
        start = 1_000 + number * 10_000.0
        builder.step(number + 1, start, 9_999)
        builder.frame("vit.py(96): forward", start + 5, 900)
        builder.host("aten::expand", start + 10, 6, **{"Input Dims": [[1, 1, 768], []]})
        builder.host("aten::cat", start + 20, 30, **{"Input Dims": [[[16, 1, 768], [16, 196, 768]], []]})
        builder.memory(start + 25, 4_841_472, base + 4_841_472, addr=(2 << 32) + number)  # [16, 197, 768] bf16
        external = builder.host("aten::layer_norm", start + 60, 40,
                                **{"Input Dims": [[16, 197, 768], [], [768], [768], []]})  # fmt: skip
        builder.launch(start + 70, 8, work_ts=start + 100, work_dur=80, external=external, kernel=ELEMENTWISE)
        builder.memory(start + 65, 4_841_472, base + 2 * 4_841_472, addr=(3 << 32) + number)
        linear = start + 120
        builder.frame("vit.py(41): forward", linear - 2, 200)
        builder.host("aten::linear", linear, 150, **{"Input Dims": [[16, 197, 768], [2304, 768], [2304]]})
        builder.host("aten::t", linear + 5, 8, **{"Input Dims": [[2304, 768]]})
        external = builder.host("aten::addmm", linear + 20, 120,
                                **{"Input Dims": [[2304], [3152, 768], [768, 2304], [], []]})  # fmt: skip
        held = base + 2 * 4_841_472
        builder.memory(linear + 25, 14_524_416, held + 14_524_416, addr=(4 << 32) + number)  # the output, bf16
        builder.memory(linear + 40, 76 * MIB, held + 14_524_416 + 76 * MIB, addr=5 << 32)  # cuBLASLt workspace
        builder.launch(linear + 60, 10, work_ts=linear + 80, work_dur=400, external=external, kernel=GEMM)
        builder.memory(linear + 130, -76 * MIB, held + 14_524_416, addr=5 << 32)
        _rest_of_the_model(builder, linear + 200, work_ts=linear + 500)
        held += 14_524_416
        for index, (addr, size) in enumerate((((2 << 32) + number, 4_841_472), ((3 << 32) + number, 4_841_472),
                                              ((4 << 32) + number, 14_524_416))):  # fmt: skip
            held -= size
            builder.memory(start + 8_000 + index * 10, -size, held, addr=addr)
    return builder


def expand_then_contiguous() -> TraceBuilder:
    """Twin of ``vit_block_with_cublas_workspace``: ``x.expand(256, 1024, 1024).contiguous()`` from x [256, 1, 1024]
    fp32: the copy writes 1 GiB and holds it until the end of the step.

    Engineer: a materialised broadcast: ``memory_spike`` naming the expand, 1 GiB.
    """
    builder = TraceBuilder()
    builder.device_properties = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 80 * 2**30}]
    builder.memory(10, 20 * MIB, 20 * MIB, addr=1 << 32)
    for number in range(3):
        start = 1_000 + number * 10_000.0
        builder.step(number + 1, start, 9_999)
        builder.frame("pairwise.py(31): forward", start + 5, 400)
        builder.host("aten::expand", start + 10, 5, **{"Input Dims": [[256, 1, 1024], []]})
        builder.host("aten::contiguous", start + 20, 300, **{"Input Dims": [[256, 1024, 1024]]})
        builder.host("aten::clone", start + 25, 290, **{"Input Dims": [[256, 1024, 1024], []]})
        external = builder.host("aten::copy_", start + 60, 200,
                                **{"Input Dims": [[256, 1024, 1024], [256, 1024, 1024], []]})  # fmt: skip
        builder.memory(start + 40, 1024 * MIB, 1044 * MIB, addr=2 << 32)
        builder.launch(start + 70, 8, work_ts=start + 100, work_dur=600, external=external, kernel=ELEMENTWISE)
        _rest_of_the_model(builder, start + 350, work_ts=start + 720)
        builder.memory(start + 9_500, -1024 * MIB, 20 * MIB, addr=2 << 32)
    return builder


# --- the cases ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """A class of issue 33: the builder, whether it is the planted case or the twin, and the engineer's verdict."""

    name: str
    issue_class: int
    build: Callable[[], TraceBuilder | list[TraceBuilder]]
    planted: bool  # True: the failure shape; False: its quiet (or still-flagged) twin
    expect: str  # the engineer's verdict, in a line


CASES = (
    Case("1-unmarked-comm-heavy", 1, unmarked_comm_heavy, True,
         "communication_bound + low_comm_overlap judged over the one window (54% comm, 100% exposed)"),
    Case("1-unmarked-comm-light", 1, unmarked_comm_light, False, "no communication_bound / low_comm_overlap"),
    Case("2a-first-calls-only", 2, first_calls_only, True,
         "cold_start (all one-time work); no gpu_idle host cause, no launch_bound, no host_device_sync"),
    Case("2b-cuda-only-first-launch", 2, cuda_only_first_launch, True,
         "cold_start (5.5 s first launch); no launch_bound / gpu_idle about it"),
    Case("2c-init-cudafree-then-steps", 2, init_cudafree_then_steps, True,
         "cold_start (971 ms cudaFree); no gpu_idle '(cudaFree)', no allocator_churn"),
    Case("2-twin-allocator-churn", 2, allocator_churn_every_step, False, "allocator_churn still fires"),
    Case("3-gloo-blocked-in-backward", 3, gloo_ddp_blocked_in_backward, True,
         "collective wait ~80% (communication); no host_bound"),
    Case("3-twin-python-busy", 3, python_busy_between_ops, False, "host_bound naming jitter() in train.py:61"),
    Case("4-moe-deepep-4-ranks", 4, moe_expert_parallel, True,
         "dispatch/combine counted as communication (communication_bound ~44%); no 'never communicates'"),
    Case("4-twin-single-process", 4, moe_single_process, False, "no communication finding or note"),
    Case("5-loader-under-queued-work", 5, loader_under_queued_work, True, "dataloader_bound share ~30%"),
    Case("5-twin-loader-fast", 5, loader_fast, False, "no dataloader_bound"),
    Case("6-bookkeeping-gaps", 6, forward_with_bookkeeping_gaps, True, "no host_bound"),
    Case("6-twin-user-python", 6, forward_with_user_python, False, "host_bound naming route() in model.py:77"),
    Case("7-collectives-overlap-each-other", 7, collectives_overlapping_each_other, True,
         "communication_bound ~98%; no collective ms per step above the step it is compared with"),
    Case("7-twin-one-after-another", 7, collectives_one_after_another, False,
         "communication_bound at 40% (8 ms of 20 ms)"),
    Case("8-cublas-workspace", 8, vit_block_with_cublas_workspace, True, "no memory_spike (no materialised broadcast)"),
    Case("8-twin-expand-contiguous", 8, expand_then_contiguous, False, "memory_spike: materialised broadcast, 1 GiB"),
)  # fmt: skip
