"""Loading traces and the columnar trace model."""

from .kinds import Kind
from .loader import find_trace_files, load
from .model import MemoryEvents, RankInfo, Trace

__all__ = ["Kind", "MemoryEvents", "RankInfo", "Trace", "find_trace_files", "load"]
