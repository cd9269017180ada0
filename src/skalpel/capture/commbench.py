"""``skalpel commbench``: collective bandwidth over torch.distributed, as nccl-tests measures it.

Spawns N local processes on the current backend (NCCL with one GPU each when there are
N GPUs, else gloo on CPU with one thread per rank), and for each collective and message
size times ``iters`` back-to-back calls after a warm-up and a barrier; the time of a size
is the slowest rank's mean per call (every rank waits for it), the median over
``repeats`` such runs. Sizes are nccl-tests' S: the whole output of an all_gather, the
whole input of a reduce_scatter.
"""

from __future__ import annotations

import socket
import statistics
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..analysis.collectives import busbw_factor
from ..errors import SkalpelError
from ..result.commbench import BenchRow, CommBench

TYPES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
CPU_SIZES = tuple(4**k * 1024 for k in range(0, 7))  # 1 KiB .. 4 MiB
GPU_SIZES = tuple(4**k * 1024 for k in range(0, 9))  # 1 KiB .. 64 MiB


@dataclass(frozen=True)
class BenchOptions:
    nproc: int = 2
    backend: str | None = None  # None: nccl when enough GPUs, else gloo
    sizes: tuple[int, ...] | None = None  # None: CPU_SIZES on gloo, GPU_SIZES on nccl
    types: tuple[str, ...] = TYPES
    iters: int = 10
    warmup: int = 2
    repeats: int = 3

    def __post_init__(self) -> None:
        if self.nproc < 2:
            raise SkalpelError(f"commbench needs at least 2 processes (got --nproc {self.nproc})")
        unknown = [kind for kind in self.types if kind not in TYPES]
        if unknown:
            raise SkalpelError(f"unknown collective(s) {', '.join(unknown)}; choose from {', '.join(TYPES)}")
        if self.iters < 1 or self.repeats < 1 or self.warmup < 0:
            raise SkalpelError("--iters and --repeats must be at least 1, --warmup at least 0")


def parse_size(text: str) -> int:
    """'4K' -> 4096, '64M' -> 67108864, '1G', or plain bytes; a SkalpelError when unreadable."""
    units = {"": 1, "B": 1, "K": 1024, "KB": 1024, "M": 1024**2, "MB": 1024**2, "G": 1024**3, "GB": 1024**3}
    stripped = text.strip().upper()
    number = stripped.rstrip("KMGB")
    try:
        value = int(float(number) * units[stripped[len(number):]])
    except (ValueError, KeyError):
        raise SkalpelError(f"cannot read the size {text!r} (use bytes or 1K, 4M, 1G)") from None
    if value < 1:
        raise SkalpelError(f"the size {text!r} must be at least 1 byte")
    return value


def sizes_between(low: str | None, high: str | None, backend: str | None) -> tuple[int, ...] | None:
    """Sizes from ``low`` to ``high``, x4 apart; None (the backend's defaults) when neither is given."""
    if low is None and high is None:
        return None
    defaults = GPU_SIZES if backend == "nccl" else CPU_SIZES
    first = parse_size(low) if low else defaults[0]
    last = parse_size(high) if high else defaults[-1]
    if last < first:
        raise SkalpelError(f"--max-bytes ({last}) is smaller than --min-bytes ({first})")
    sizes = [first]
    while sizes[-1] * 4 <= last:
        sizes.append(sizes[-1] * 4)
    return tuple(sizes)


def run_commbench(options: BenchOptions) -> CommBench:
    """Measure every collective at every size on ``options.nproc`` local processes."""
    backend = options.backend or ("nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= options.nproc else "gloo")
    if backend == "nccl" and torch.cuda.device_count() < options.nproc:
        raise SkalpelError(f"nccl needs one GPU per process: {torch.cuda.device_count()} GPU(s) for {options.nproc}")
    sizes = options.sizes or (GPU_SIZES if backend == "nccl" else CPU_SIZES)
    with tempfile.TemporaryDirectory(prefix="skalpel-commbench-") as folder:
        result = Path(folder) / "rank0.json"
        port = _free_port()
        try:
            mp.start_processes(_worker, args=(options, backend, sizes, port, str(result)), nprocs=options.nproc,
                               join=True, start_method="spawn")  # fmt: skip
        except mp.ProcessRaisedException as error:
            raise SkalpelError(f"commbench failed in a worker: {str(error).strip().splitlines()[-1]}") from None
        return CommBench.from_json(result.read_bytes())


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _worker(rank: int, options: BenchOptions, backend: str, sizes: tuple[int, ...], port: int, out: str) -> None:
    warnings.filterwarnings("ignore", category=FutureWarning)  # *_into_tensor renamed in torch 2.13; still works
    torch.set_num_threads(1)
    device = torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=options.nproc)
    rows, skipped = [], []
    for kind in options.types:
        try:
            for nbytes in sizes:
                rows.append(_measure(kind, nbytes, options, device))
        except (RuntimeError, NotImplementedError, ValueError) as error:
            skipped.append(f"{kind}: {str(error).strip().splitlines()[0][:120]}")
            dist.barrier()
    if rank == 0:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        bench = CommBench(backend, options.nproc, name, torch.__version__, tuple(rows), tuple(skipped))
        Path(out).write_bytes(bench.to_json())
    dist.barrier()
    dist.destroy_process_group()


def _measure(kind: str, nbytes: int, options: BenchOptions, device: torch.device) -> BenchRow:
    n = options.nproc
    call = _collective(kind, max(nbytes // 4 // n, 1) * n, n, device)
    size = max(nbytes // 4 // n, 1) * n * 4  # S, rounded to whole float32 elements per rank
    for _ in range(options.warmup):
        call()
    times = []
    for _ in range(options.repeats):
        _sync(device)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(options.iters):
            call()
        _sync(device)
        mean = torch.tensor([(time.perf_counter() - start) / options.iters * 1e6], dtype=torch.float64)
        dist.all_reduce(mean, op=dist.ReduceOp.MAX)  # the job waits for its slowest rank
        times.append(float(mean.item()))
    time_us = statistics.median(times)
    algbw = size / time_us / 1e3
    return BenchRow(kind, size, round(time_us, 3), round(algbw, 4), round(algbw * busbw_factor(kind, n), 4))


def _collective(kind: str, elements: int, n: int, device: torch.device):
    """A no-argument call running one collective whose nccl-tests size is ``elements`` float32."""
    whole = torch.ones(elements, device=device)
    part = torch.ones(elements // n, device=device)
    if kind == "all_reduce":
        return lambda: dist.all_reduce(whole)
    if kind == "all_gather":
        return lambda: dist.all_gather_into_tensor(whole, part)
    if kind == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(part, whole)
    if kind == "broadcast":
        return lambda: dist.broadcast(whole, src=0)
    output = torch.empty_like(whole)
    return lambda: dist.all_to_all_single(output, whole)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)

