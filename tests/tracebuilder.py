"""A small, readable builder of one rank's Kineto trace, in today's torch.profiler schema, for rule tests.

Host ops, annotations and launch calls go on thread 100, device work on stream 7 (others where asked), linked
as torch.profiler links them (``External id`` from an op to its launch calls, ``correlation``
from a launch call to its kernel). The tests run the real loader, analyses and rules on
the written file.
"""

from __future__ import annotations

import json
from pathlib import Path

HOST, DEVICE, STREAM = 100, 0, 7
COMM_STREAM = 20  # the stream ProcessGroupNCCL runs its collectives on
NCCL_KERNELS = {  # collective -> (the c10d name in the args, the kernel as NCCL 2.2x names it)
    "all_reduce": ("allreduce", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"),
    "all_gather": ("_allgather_base", "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"),
    "reduce_scatter": ("_reduce_scatter_base",
                       "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"),
}


class TraceBuilder:
    """Builds one rank's Kineto trace: host ops and launches on thread 100, device work on stream 7."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self._ids = 1000
        self.device_properties = [{"id": 0, "name": "Test GPU", "totalGlobalMem": 16 * 2**30}]
        self.header: dict = {}  # more header keys: distributedInfo, host_name, ...

    def _next_id(self) -> int:
        self._ids += 1
        return self._ids

    def host(self, name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = HOST, **args) -> int:
        external = self._next_id()
        self.events.append(
            {"ph": "X", "cat": cat, "name": name, "pid": HOST, "tid": tid, "ts": ts, "dur": dur,
             "args": {"External id": external, **args}}
        )  # fmt: skip
        return external

    def step(self, number: int, ts: float, dur: float) -> None:
        self.host(f"ProfilerStep#{number}", ts, dur, cat="user_annotation")

    def frame(self, where: str, ts: float, dur: float) -> None:
        """A Python frame (with_stack=True), e.g. ``train.py(42): train_step``."""
        self.events.append({"ph": "X", "cat": "python_function", "name": where, "pid": HOST, "tid": HOST,
                            "ts": ts, "dur": dur, "args": {"Python id": self._next_id()}})  # fmt: skip

    def launch(self, ts: float, dur: float, *, work_ts: float, work_dur: float, external: int = 0,
               name: str = "cudaLaunchKernel", kernel: str = "volta_sgemm_128x64_nn", cat: str = "kernel",
               nbytes: int = 0, stream: int = STREAM, tid: int = HOST, args: dict | None = None,
               api: str = "cuda_runtime") -> None:  # fmt: skip
        """A launch call on thread ``tid`` and the device work it queued on ``stream`` (``args``: more kernel args;
        ``api``: the call's category, ``cuda_driver`` for ``cuLaunchKernel``)."""
        correlation = self._next_id()
        self.events.append(
            {"ph": "X", "cat": api, "name": name, "pid": HOST, "tid": tid, "ts": ts, "dur": dur,
             "args": {"correlation": correlation, "external id": external}}
        )  # fmt: skip
        work_args = {"device": DEVICE, "stream": stream, "correlation": correlation, "external id": external, **(args or {})}
        if nbytes:
            work_args["bytes"] = nbytes
        self.events.append(
            {"ph": "X", "cat": cat, "name": kernel, "pid": DEVICE, "tid": stream, "ts": work_ts, "dur": work_dur,
             "args": work_args}
        )  # fmt: skip

    def runtime(self, name: str, ts: float, dur: float, tid: int = HOST) -> None:
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": HOST, "tid": tid, "ts": ts, "dur": dur,
                            "args": {"correlation": self._next_id(), "external id": 0}})  # fmt: skip

    def nccl(self, ts: float, *, work_ts: float, work_dur: float, collective: str = "all_reduce", nelems: int = 1 << 22,
             group: int = 2, stream: int = COMM_STREAM, dtype: str = "BFloat16") -> None:  # fmt: skip
        """A collective as torch 2.x records it: ``record_param_comms`` around ``nccl:<collective>`` on the host,
        the NCCL kernel on ``stream`` with the collective's args (``collective``: all_reduce, all_gather, ...)."""
        name, kernel = NCCL_KERNELS[collective]
        meta = {"Collective name": name, "In msg nelems": nelems, "Out msg nelems": nelems, "Group size": group,
                "dtype": dtype, "Process Group Name": "0", "Process Group Description": "default_pg"}  # fmt: skip
        if collective == "all_gather":
            meta["Out msg nelems"] = nelems * group
        elif collective == "reduce_scatter":
            meta["In msg nelems"] = nelems * group
        outer = self.host("record_param_comms", ts, 40, **meta)
        self.host(f"nccl:{collective}", ts + 2, 36)
        self.launch(ts + 10, 12, work_ts=work_ts, work_dur=work_dur, external=outer, kernel=kernel, stream=stream,
                    args=meta)  # fmt: skip

    def memory(self, ts: float, nbytes: int, total_allocated: int, *, device_type: int = 1,
               addr: int = 1 << 30) -> None:  # fmt: skip
        """One ``[memory]`` instant: an allocation (nbytes > 0) or a free (nbytes < 0) of the block at ``addr``
        (one address for all unless given: then the analysis cannot pair by address and pairs by size)."""
        self.events.append({"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": HOST,
                            "tid": HOST, "ts": ts, "args": {"Device Type": device_type, "Device Id": 0,
                            "Addr": addr, "Bytes": nbytes, "Total Allocated": total_allocated,
                            "Total Reserved": max(total_allocated, 1 << 30)}})  # fmt: skip

    def gloo_all_reduce(self, ts: float, dur: float, *, group: int = 2, nelems: int = 1_000_000) -> int:
        """An all_reduce of ``nelems`` floats (4 MB by default) on gloo's own thread."""
        return self.host("gloo:all_reduce", ts, dur, tid=200, **{"In msg nelems": nelems, "Out msg nelems": nelems,
                                                                  "dtype": "Float", "Group size": group})  # fmt: skip

    def write(self, path: Path) -> Path:
        document = {"schemaVersion": 1, "deviceProperties": self.device_properties, **self.header,
                    "traceEvents": self.events}  # fmt: skip
        path.write_text(json.dumps(document))
        return path


def cpu_rank(rank: int, world_size: int = 2) -> TraceBuilder:
    """One rank of a gloo job on CPUs, on host node0 with its peers (one clock: collective ends taken as recorded)."""
    builder = TraceBuilder()
    builder.device_properties = []
    builder.header = {"distributedInfo": {"rank": rank, "world_size": world_size, "backend": "gloo"}, "host_name": "node0"}
    return builder


def gpu_rank(rank: int, world_size: int = 2, *, memory_gib: int = 80) -> TraceBuilder:
    """One rank of an NCCL job on one H100 each, all on host node0 (one clock: collective ends taken as recorded)."""
    builder = TraceBuilder()
    builder.device_properties = [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": memory_gib * 2**30}]
    builder.header = {"distributedInfo": {"rank": rank, "world_size": world_size, "backend": "nccl"}, "host_name": "node0"}
    return builder
