"""The report of a torchrun job's capture, written once, in a process of its own (``jobcapture.py`` starts it).

``python -m skalpel.watching.collect FOLDER WORLD_SIZE WAIT_S``: waits until every rank left its
marker in FOLDER (its trace, or why it has none), at most WAIT_S seconds, then analyses the
traces there as ``skalpel run`` analyses a job's (``job/build.py``) and writes the run folder's
outputs (``report.json``, ``report.html``, ``summary.txt``, the flame graph), with a warning for
each rank without a trace. Its one line for the anomaly (``capture_summary``) goes to
``.watch-summary.txt``. No torch here: the ranks' processes train on meanwhile.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import SkalpelError
from .jobcapture import SUMMARY, read_markers

POLL_S = 0.2


def capture_summary(report: Any) -> str:
    """The capture's answer in one line: its findings, most severe first."""
    findings = [finding for finding in report.findings if finding.id not in ("not_judged",)]
    if not findings:
        return "no finding"
    return "; ".join(f"{finding.id}: {finding.title}" for finding in findings[:3])


def collect(folder: Path, world_size: int, wait_s: float) -> str:
    """Wait for the ranks' markers, write the job's report into ``folder``; the one-line summary."""
    deadline = time.monotonic() + wait_s
    markers = read_markers(folder, world_size)
    while len(markers) < world_size and time.monotonic() < deadline:
        time.sleep(POLL_S)
        markers = read_markers(folder, world_size)
    notes = [f"rank {rank}: {marker['note']}" for rank, marker in sorted(markers.items()) if marker.get("note")]
    silent = [str(rank) for rank in range(world_size) if rank not in markers]
    if silent:
        notes.append(f"no trace from rank(s) {', '.join(silent)} after {wait_s:.0f} s ($SKALPEL_RANK_WAIT_S); "
                     f"the report covers the ranks with a trace")  # fmt: skip
    traces = [folder / marker["trace"] for _, marker in sorted(markers.items())
              if marker.get("trace") and (folder / marker["trace"]).is_file()]  # fmt: skip
    if not traces:
        return "no report: no rank recorded the steps" + (f" ({'; '.join(notes)})" if notes else "")
    from ..capture import runfolder
    from ..capture.timing import with_noise_note
    from ..job.report_of import report_of
    from ..result.checked import ReportFormatError
    from ..result.report import CaptureInfo, capture_from_dict

    timing = next((marker["capture"] for _, marker in sorted(markers.items()) if marker.get("capture")), None)
    capture = None
    if timing is not None:  # only the fields CaptureInfo has
        known = {field.name for field in dataclasses.fields(CaptureInfo)}
        try:
            capture = capture_from_dict({key: value for key, value in timing.items() if key in known})
        except ReportFormatError as error:  # a damaged marker: the report goes on without the capture's figures
            notes.append(f"the capture's timing is left out: {error}")
    analysis = report_of(traces, capture=capture, notes=notes, flame_files=True)
    assert analysis.flame is not None
    report = with_noise_note(analysis.report)
    runfolder.write_outputs(report, analysis.flame, folder, traces=traces)
    return capture_summary(report)


def main(argv: list[str]) -> int:
    folder, world_size, wait_s = Path(argv[0]), int(argv[1]), float(argv[2])
    try:
        line = collect(folder, world_size, wait_s)
    except SkalpelError as error:
        line = f"no report: {error}"
    except Exception as error:  # noqa: BLE001 - said in the anomaly's summary rather than lost in a log
        line = f"no report: {type(error).__name__}: {error}"
    (folder / SUMMARY).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
