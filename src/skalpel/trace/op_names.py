"""What an op's name says beyond its role: the DataLoader iterator, the attention ops and SDPA's backend, the copy
ops. The analyses that need these ask here, so no analysis or rule tests an event's name (``roles.py`` holds the
names that give an event its role). Each distinct name is tested once, never each event."""

from __future__ import annotations

from typing import Iterable

import numpy as np

from .model import Trace

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
    ids = [found for found in (trace.name_id(name) for name in names) if found >= 0]
    return np.isin(trace.name, ids) if ids else np.zeros(len(trace), dtype=bool)
