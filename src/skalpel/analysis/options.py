"""The numbers analyses decide with by default that the findings' thresholds also state: declared here once.

``diagnose/thresholds.py`` states these in its params (``skalpel explain`` prints them) by reading them from
here: analysis may not import diagnose, and a number declared in both places drifts (blame's one_time_init and
cold_start would then disagree on what one-time work is).
"""

from __future__ import annotations

# one-time work (onetime.py; the cold_start rule): a first call this many times slower than the median of the later
# calls of its name, and at least this long
FIRST_CALL_RATIO = 10.0
FIRST_CALL_MIN_MS = 10.0
# a kernel's first launch this long loaded its module (a launch takes microseconds): one-time work even called once
FIRST_LAUNCH_MIN_MS = 1.0
# the ledger (ledger.py): a recording this much one-time work on every rank has no steady state to judge
# (diagnose/__init__.py says so for every rule but the measurement's and compile's)
ALL_ONE_TIME_PCT = 80.0
# the ledger's host lane: a gap shorter than this between back-to-back ops, with no Python call in it, is the next
# op's dispatch and the profiler's bookkeeping (between_ops), not the user's Python (host_bound's)
BETWEEN_OPS_US = 10.0

# HTA's consecutive_kernel_delay: a gap between queued kernels shorter than this is the device's own dispatch
# (blame.py's launch_overhead, gpu_time.py's kernel_wait)
KERNEL_WAIT_US = 30.0

# rankwork.py (straggler_rank): an op a rank calls this many times as often a step as the others' median is extra work
MIN_CALL_RATIO = 1.5

# broadcast.py (memory_spike): the expand is issued this soon before the copy that materialises it (the same Python
# line in practice)
BROADCAST_LOOK_BACK_US = 1000.0
