"""The fixes ``skalpel tune`` can try, when each is relevant, and the edit each one stands for.

A candidate is a mechanical fix: a ``fix`` dict for the launcher (``patches.Patcher`` reads it)
and, for the report, the exact change at the line of the user's code that it acts on. Which
candidates run follows the profile's findings (``dataloader_bound`` -> more workers) and the
machine: a GPU brings pinned memory, bf16, cudnn autotuning; a host-bound step (every CPU run,
or a GPU run whose findings at any severity say launches or idle gaps) brings ``torch.compile``;
loader workers and intra-op threads that together exceed the usable cores bring the plan ``skalpel run``'s
advice names (``cores.workers_that_fit``), no workers at all, and a split of the cores between the two
(``cores.worker_split``); an optimizer that the installed torch runs ``fused=True`` for on its device
(probed in the baseline run, not assumed by device type) brings ``fused``. All filtered by what the
script builds (no DataLoader, no DataLoader candidate). ``--try NAME`` runs one anyway.
Candidates that need a GPU, on a machine without one, are listed once as not applicable.

``facts`` is what the baseline run recorded (``Patcher.facts``): loaders, optimizers, the model,
threads, device. Nothing here imports torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from ..cores import loader_workers, threads_beside_workers, worker_split, workers_that_fit
from .edits import parses

Facts = dict[str, Any]
Fix = dict[str, Any]


@dataclass(frozen=True)
class Candidate:
    name: str
    what: str
    findings: tuple[str, ...]  # finding ids that make it relevant
    device_rule: Callable[[Facts, int], bool]  # relevant from the machine alone (facts, usable cores)
    why_not: Callable[[Facts, int], str | None]  # None when it applies to this script, else why not
    fix: Callable[[Facts, int], Fix]
    changes: Callable[[Facts, int], list[dict[str, Any]]]  # [{location, before, after, edit}]
    device_note: str = ""  # when device_rule holds, in words (for --list)
    gpu_only: bool = False  # never applies without a GPU: listed once as not applicable there


def _gpu(facts: Facts) -> bool:
    return facts.get("device") == "cuda"


def _never(facts: Facts, cores: int) -> bool:
    return False


def _on_gpu(facts: Facts, cores: int) -> bool:
    return _gpu(facts)


def _workers(facts: Facts, cores: int) -> int:
    """``skalpel run``'s sizing (``cores.loader_workers``); 1 on one core, where ``why_not`` stops it first."""
    return loader_workers(cores) or 1


def _loader_workers(facts: Facts) -> int:
    """The most workers any of the script's DataLoaders has."""
    return max((loader.get("num_workers") or 0 for loader in facts.get("loaders", [])), default=0)


def _settings_text(facts: Facts, key: str) -> str:
    """The real current settings, in words: ``num_workers=4`` or ``num_workers=4, 0``."""
    values = [loader.get(key) for loader in facts.get("loaders", [])]
    return f"{key}={', '.join(_text(value) for value in values)}"


def set_keyword(code: str, key: str, value: str) -> str | None:
    """``code`` (a statement ending in a call, over one line or several) with ``key=value`` set in its outermost
    call; None when unsure, and None rather than an edit that does not parse."""
    if not code or code.count("(") != code.count(")") or not code.rstrip().endswith(")"):
        return None
    found = re.search(rf"\b{re.escape(key)}\s*=", code)
    if found:
        end = _argument_end(code, found.end())
        edited = None if end is None else f"{code[:found.start()]}{key}={value}{code[end:]}"
    else:
        last = code.rstrip()[:-1].rstrip()
        arguments = last[last.find("(") + 1 :]
        if "\n" in arguments:  # one argument a line: the new one on its own line, before the closing bracket
            indent = re.match(r"\s*", last.splitlines()[-1]).group(0)
            comma = "" if last.endswith((",", "(")) else ","
            edited = f"{last}{comma}\n{indent}{key}={value},\n)"
        else:
            joiner = "" if last.endswith("(") else (" " if last.endswith(",") else ", ")
            edited = f"{last}{joiner}{key}={value})"
    return edited if parses(edited) else None


def _argument_end(code: str, start: int) -> int | None:
    """Where the argument value starting at ``start`` ends: the next ``,`` or ``)`` outside brackets."""
    depth = 0
    for index in range(start, len(code)):
        char = code[index]
        if char in "([{":
            depth += 1
        elif char in ")]}" and depth:
            depth -= 1
        elif char in ",)" and not depth:
            return index
    return None


def _keyword_changes(objects: list[dict[str, Any]], key: str, value: str, call: str) -> list[dict[str, Any]]:
    changes = []
    for item in objects:
        site = item.get("site") or {}
        code = site.get("code", "")
        changes.append({"location": site.get("location"), **_lines(site), "before": code or None,
                        "after": set_keyword(code, key, value), "edit": f"pass {key}={value} to {item.get('class') or call}(...)"})  # fmt: skip
    return changes


def _lines(site: dict[str, Any]) -> dict[str, int | None]:
    """The statement a change rewrites: its first and last lines in the file (``edits.statement_at``)."""
    line = site.get("line")
    return {"line": line, "end_line": site.get("end_line", line)}


def _threads_for_workers(facts: Facts, cores: int) -> int | None:
    """The intra-op threads ``skalpel run``'s advice sets beside its workers (``cores.threads_beside_workers``)."""
    return threads_beside_workers(cores, facts.get("threads", 1))


def _loader_candidate(name: str, key: str, what: str, findings: tuple[str, ...], *,
                      value: Callable[[Facts, int], Any], threads: Callable[[Facts, int], int | None] | None = None,
                      needs_workers: bool = False, gpu_only: bool = False) -> Candidate:  # fmt: skip
    def targets(facts: Facts, cores: int) -> list[dict[str, Any]]:
        wanted = value(facts, cores)
        return [loader for loader in facts.get("loaders", [])
                if (not needs_workers or loader.get("num_workers")) and _less(loader.get(key), wanted)]  # fmt: skip

    def why_not(facts: Facts, cores: int) -> str | None:
        if not facts.get("loaders"):
            return "the script builds no DataLoader"
        if gpu_only and not _gpu(facts):
            return "pinned memory only speeds up copies to a GPU"
        if key == "num_workers" and loader_workers(cores) is None:
            return f"with {cores} usable core, worker processes would only compete with training"
        if needs_workers and not any(loader.get("num_workers") for loader in facts["loaders"]):
            return f"{key} needs a DataLoader with workers (num_workers > 0)"
        if not targets(facts, cores):
            wanted = value(facts, cores)
            at_least = "" if isinstance(wanted, bool) else "at least "
            return f"every DataLoader already has {at_least}{key}={_text(wanted)} ({_settings_text(facts, key)})"
        return None

    def set_threads(facts: Facts, cores: int) -> int | None:
        return threads(facts, cores) if threads is not None else None

    def fix(facts: Facts, cores: int) -> Fix:
        fitting = set_threads(facts, cores)
        return {"dataloader": {key: value(facts, cores)}, **({"threads": fitting} if fitting else {})}

    def changes(facts: Facts, cores: int) -> list[dict[str, Any]]:
        fitting = set_threads(facts, cores)
        edits = _keyword_changes(targets(facts, cores), key, _text(value(facts, cores)), "DataLoader")
        return edits + (_threads_changes(facts, fitting) if fitting else [])

    return Candidate(
        name=name, what=what, findings=findings, device_rule=_on_gpu if gpu_only else _never, why_not=why_not,
        fix=fix, changes=changes,
        device_note="on a GPU" if gpu_only else "", gpu_only=gpu_only,
    )  # fmt: skip


def _competing(facts: Facts, cores: int) -> bool:
    """Loader workers and intra-op threads together exceed the usable cores (on the host: a GPU run's threads idle)."""
    return not _gpu(facts) and _loader_workers(facts) > 0 and _loader_workers(facts) + facts.get("threads", 1) > cores


def _fit(facts: Facts, cores: int) -> tuple[int, int | None] | None:
    """``cores.workers_that_fit``: the plan ``skalpel run``'s ``loader_oversubscribed`` advice names too."""
    return workers_that_fit(_loader_workers(facts), facts.get("threads", 1), cores)


def _fewer_workers_why_not(facts: Facts, cores: int) -> str | None:
    if not facts.get("loaders"):
        return "the script builds no DataLoader"
    if _fit(facts, cores) is None:
        return (f"{_settings_text(facts, 'num_workers')} and {facts.get('threads', 1)} intra-op threads fit in the "
                f"{cores} usable cores")  # fmt: skip
    return None


def _fewer_workers_fix(facts: Facts, cores: int) -> Fix:
    workers, threads = _fit(facts, cores) or (1, None)
    return {"dataloader": {"num_workers": workers}, **({"threads": threads} if threads else {})}


def _fewer_workers_changes(facts: Facts, cores: int) -> list[dict[str, Any]]:
    fix = _fewer_workers_fix(facts, cores)
    wanted = fix["dataloader"]["num_workers"]
    loaders = [loader for loader in facts.get("loaders", []) if (loader.get("num_workers") or 0) > wanted]
    changes = _keyword_changes(loaders, "num_workers", str(wanted), "DataLoader")
    for change, loader in zip(changes, loaders):
        change["edit"] += (f" (now {loader.get('num_workers')} workers with {facts.get('threads', 1)} intra-op "
                           f"threads on {cores} usable cores)")  # fmt: skip
    return changes + (_threads_changes(facts, fix["threads"]) if "threads" in fix else [])


def _no_workers_changes(facts: Facts, cores: int) -> list[dict[str, Any]]:
    loaders = [loader for loader in facts.get("loaders", []) if loader.get("num_workers")]
    changes = _keyword_changes(loaders, "num_workers", "0", "DataLoader")
    for change in changes:  # persistent_workers and prefetch_factor are errors without workers
        for key, value in (("persistent_workers", "False"), ("prefetch_factor", "None")):
            if change["after"] and re.search(rf"\b{key}\s*=", change["after"]):
                change["after"] = set_keyword(change["after"], key, value)
    return changes


def _split(facts: Facts, cores: int) -> tuple[int, int]:
    return worker_split(_loader_workers(facts), facts.get("threads", 1), cores)


def _split_why_not(facts: Facts, cores: int) -> str | None:
    why = _fewer_workers_why_not(facts, cores)
    if why is not None:
        return why
    workers, threads = _split(facts, cores)
    if threads == facts.get("threads", 1):
        return f"the split of {cores} cores keeps {threads} intra-op threads: fewer_workers tries it"
    if _split_fix(facts, cores) == _fewer_workers_fix(facts, cores):
        return f"the split of {cores} cores ({workers} worker(s), {threads} thread(s)) is what fewer_workers tries"
    return None


def _split_fix(facts: Facts, cores: int) -> Fix:
    workers, threads = _split(facts, cores)
    return {"dataloader": {"num_workers": workers}, "threads": threads}


def _split_changes(facts: Facts, cores: int) -> list[dict[str, Any]]:
    workers, threads = _split(facts, cores)
    loaders = [loader for loader in facts.get("loaders", []) if loader.get("num_workers") != workers]
    changes = _keyword_changes(loaders, "num_workers", str(workers), "DataLoader")
    return changes + _threads_changes(facts, threads)


def _less(current: Any, wanted: Any) -> bool:
    if isinstance(wanted, bool):
        return not current
    return current is None or current < wanted


def _text(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _optimizer_candidate(key: str, findings: tuple[str, ...], *, probed: bool = False) -> Candidate:
    """``foreach=True`` or ``fused=True``; ``probed``: tried wherever the baseline run found that the installed torch
    runs it for the script's optimizer on its device (``patches.fused_runs``), finding or not."""

    def runs_here(opt: dict[str, Any]) -> bool:
        return not probed or bool(opt.get(f"{key}_supported"))

    def targets(facts: Facts) -> list[dict[str, Any]]:
        return [opt for opt in facts.get("optimizers", [])
                if key in opt.get("accepts", ()) and not opt.get(key) and runs_here(opt)]  # fmt: skip

    def why_not(facts: Facts, cores: int) -> str | None:
        if not facts.get("optimizers"):
            return "the script builds no torch.optim optimizer"
        if not targets(facts):
            unsupported = [opt for opt in facts["optimizers"] if key in opt.get("accepts", ()) and not runs_here(opt)]
            if unsupported:
                opt = unsupported[0]
                return f"this torch does not run {key}=True for {opt.get('class')} on {opt.get('device', 'this device')}"
            return f"no optimizer takes {key}=True, or it is already set"
        return None

    def supported(facts: Facts, cores: int) -> bool:
        return probed and bool(targets(facts))

    return Candidate(
        name=f"{key}_optimizer", what=f"{key}=True in the optimizer: one kernel (or a few) for all parameters",
        findings=findings, device_rule=supported, why_not=why_not,
        fix=lambda facts, cores: {"optimizer": {key: True}},
        changes=lambda facts, cores: _keyword_changes(targets(facts), key, "True", "the optimizer"),
        device_note="where this torch runs it for the script's optimizer on its device (probed)" if probed else "",
    )  # fmt: skip


def _model_changes(wrap: str) -> Callable[[Facts, int], list[dict[str, Any]]]:
    def changes(facts: Facts, cores: int) -> list[dict[str, Any]]:
        model = facts.get("model") or {}
        site = model.get("site") or {}
        code = site.get("code") or ""
        match = re.match(r"^(?P<name>[A-Za-z_][\w.]*)\s*=", code)
        # after the whole statement (its last line), never inside it; a compound one (a for header) is left alone
        after = f"{code}\n{match['name']} = {wrap.format(match['name'])}" if match and site.get("simple", True) else None
        return [{"location": site.get("location"), **_lines(site), "before": code or None,
                 "after": after if parses(after) else None,
                 "edit": f"wrap the model built here ({model.get('class', 'model')}) as {wrap.format('model')}"}]  # fmt: skip

    return changes


def _model_why_not(gpu_only: bool) -> Callable[[Facts, int], str | None]:
    def why_not(facts: Facts, cores: int) -> str | None:
        if not facts.get("model"):
            return "no nn.Module with parameters was called"
        if gpu_only and not _gpu(facts):
            return "CUDA graphs need a GPU"
        return None

    return why_not


def _autocast_why_not(facts: Facts, cores: int) -> str | None:
    if not facts.get("model"):
        return "no nn.Module with parameters was called"
    return None


def _autocast_changes(facts: Facts, cores: int) -> list[dict[str, Any]]:
    model = facts.get("model") or {}
    site = model.get("call_site") or {}
    device = "cuda" if _gpu(facts) else "cpu"
    return [{"location": site.get("location"), **_lines(site), "before": site.get("code") or None, "after": None,
             "edit": f'run this forward pass under `with torch.autocast("{device}", dtype=torch.bfloat16):`'}]  # fmt: skip


def _threads_why_not(facts: Facts, cores: int) -> str | None:
    if _gpu(facts):
        return "the model runs on a GPU; host threads are not its limit"
    if facts.get("threads", 0) == cores:  # fewer threads than cores leave some idle; more fight over them
        return f"torch already uses {facts.get('threads')} threads for {cores} usable cores"
    return None


def _host_bound(facts: Facts, cores: int) -> bool:
    """The whole step runs on the host (a CPU run: its ops' dispatch and Python are the step), with a model to compile."""
    return not _gpu(facts) and bool(facts.get("model"))


def _threads_changes(facts: Facts, cores: int) -> list[dict[str, Any]]:
    """The edit to ``torch.set_num_threads(cores)``: at the script's own call, else at its start."""
    call = facts.get("threads_call") or {}
    site = call.get("site") or {}
    if site.get("code"):
        after = re.sub(r"set_num_threads\(\s*[^)]*\)", f"set_num_threads({cores})", site["code"], count=1)
        return [{"location": site.get("location"), **_lines(site), "before": site["code"], "after": after,
                 "edit": f"torch.set_num_threads({cores})"}]  # fmt: skip
    return [{"location": None, "line": None, "end_line": None, "before": None, "after": f"torch.set_num_threads({cores})",
             "edit": f"call torch.set_num_threads({cores}) at the start of the script"}]  # fmt: skip


def _cudnn_why_not(facts: Facts, cores: int) -> str | None:
    if not _gpu(facts):
        return "cuDNN autotuning needs a GPU"
    return "torch.backends.cudnn.benchmark is already True" if facts.get("cudnn_benchmark") else None


_LOADER = ("dataloader_bound",)
_LAUNCH = ("launch_bound", "gpu_idle")  # at any severity: a host-bound GPU step
_CONTENTION = ("cpu_contention",)  # dataloader_bound brings more workers; fewer come from the machine

CATALOGUE: tuple[Candidate, ...] = (
    _loader_candidate("num_workers", "num_workers",
                      "build batches in worker processes (one per usable core, at most 4)",
                      _LOADER, value=_workers, threads=_threads_for_workers),
    Candidate("fewer_workers", "fewer DataLoader workers: workers and intra-op threads share the usable cores",
              _CONTENTION, device_rule=_competing, why_not=_fewer_workers_why_not, fix=_fewer_workers_fix,
              changes=_fewer_workers_changes, device_note="when loader workers + intra-op threads exceed the cores"),
    Candidate("no_workers", "no DataLoader workers: the training process makes its batches (cheap batches cost "
              "less to make than a worker's hand-over)", _CONTENTION, device_rule=_competing,
              why_not=_fewer_workers_why_not, fix=lambda facts, cores: {"dataloader": {"num_workers": 0}},
              changes=_no_workers_changes, device_note="when loader workers + intra-op threads exceed the cores"),
    Candidate("workers_threads", "split the usable cores between DataLoader workers and intra-op threads "
              "(torch.set_num_threads)", _CONTENTION, device_rule=_competing, why_not=_split_why_not,
              fix=_split_fix, changes=_split_changes,
              device_note="when loader workers + intra-op threads exceed the cores"),
    _loader_candidate("pin_memory", "pin_memory", "page-locked batches: faster, asynchronous copies to the GPU",
                      _LOADER + ("pageable_memcpy",), value=lambda facts, cores: True, gpu_only=True),
    _loader_candidate("persistent_workers", "persistent_workers", "keep the workers between epochs",
                      _LOADER, value=lambda facts, cores: True, needs_workers=True),
    _loader_candidate("prefetch_factor", "prefetch_factor", "each worker keeps 4 batches ready instead of 2",
                      _LOADER, value=lambda facts, cores: 4, needs_workers=True),
    Candidate("threads", "intra-op threads: one per usable core", ("cpu_contention",),
              device_rule=lambda facts, cores: not _gpu(facts), why_not=_threads_why_not,
              fix=lambda facts, cores: {"threads": cores}, changes=_threads_changes, device_note="on a CPU"),
    Candidate("compile", "torch.compile the model (default mode)", _LAUNCH, device_rule=_host_bound,
              why_not=_model_why_not(False), fix=lambda facts, cores: {"compile": "default"},
              changes=_model_changes("torch.compile({})"), device_note="on a CPU (a host-bound step)"),
    Candidate("compile_reduce_overhead", 'torch.compile the model with mode="reduce-overhead" (CUDA graphs)',
              _LAUNCH, device_rule=_never, why_not=_model_why_not(True),
              fix=lambda facts, cores: {"compile": "reduce-overhead"},
              changes=_model_changes('torch.compile({}, mode="reduce-overhead")'), gpu_only=True),
    Candidate("autocast_bf16", "bf16 autocast around the model's forward pass", (),
              device_rule=lambda facts, cores: _gpu(facts) and bool(facts.get("bf16_supported")),
              why_not=_autocast_why_not, fix=lambda facts, cores: {"autocast": "bfloat16"},
              changes=_autocast_changes, device_note="on a GPU with bf16", gpu_only=True),
    _optimizer_candidate("foreach", ("launch_bound",)),
    _optimizer_candidate("fused", ("launch_bound",), probed=True),
    Candidate("cudnn_benchmark", "let cuDNN time its algorithms once and keep the fastest", (),
              device_rule=_on_gpu, why_not=_cudnn_why_not, fix=lambda facts, cores: {"cudnn_benchmark": True},
              changes=lambda facts, cores: [{"location": None, "line": None, "end_line": None, "before": None,
                                             "after": "torch.backends.cudnn.benchmark = True",
                                             "edit": "set torch.backends.cudnn.benchmark = True at the start"}],
              device_note="on a GPU", gpu_only=True),
)  # fmt: skip

BY_NAME = {candidate.name: candidate for candidate in CATALOGUE}


@dataclass(frozen=True)
class Choice:
    candidate: Candidate
    reason: str  # why it runs: the finding, the device, or --try


@dataclass(frozen=True)
class Selection:
    chosen: list[Choice]  # to run: forced first, then in catalogue order
    skipped: list[dict[str, str]]  # {name, why}: relevant (a finding, --try) but cannot run on this script
    not_applicable: list[dict[str, str]]  # {name, why}: needs a GPU, on a machine without one (each once)


def select(facts: Facts, finding_ids: set[str], cores: int, forced: tuple[str, ...] = (),
           skipped_names: tuple[str, ...] = ()) -> Selection:  # fmt: skip
    """Which candidates run, and why the others do not. A pure function of its arguments: the same
    facts, findings and cores give the same list in the same order."""
    chosen: list[Choice] = []
    skipped: list[dict[str, str]] = []
    not_applicable: list[dict[str, str]] = []
    for name in forced:
        why = BY_NAME[name].why_not(facts, cores)
        if why is None and BY_NAME[name].gpu_only and not _gpu(facts):
            why = "it needs a GPU"
        if why is None:
            chosen.append(Choice(BY_NAME[name], "--try"))
        else:
            skipped.append({"name": name, "why": why})
    for candidate in CATALOGUE:
        if candidate.name in forced or candidate.name in skipped_names:
            continue
        if candidate.gpu_only and not _gpu(facts):
            not_applicable.append({"name": candidate.name, "why": "needs a GPU"})
            continue
        found = sorted(finding_ids & set(candidate.findings))
        if not found and not candidate.device_rule(facts, cores):
            continue
        why = candidate.why_not(facts, cores)
        if why is not None:
            if found:  # a finding pointed at it: say why it cannot run (a device default that does not apply is no news)
                skipped.append({"name": candidate.name, "why": why})
            continue
        reason = ", ".join(found) if found else _machine_reason(candidate, facts, cores)
        chosen.append(Choice(candidate, reason))
    return Selection(chosen, skipped, not_applicable)


def _machine_reason(candidate: Candidate, facts: Facts, cores: int) -> str:
    """Why a candidate runs with no finding behind it, in words that name the machine's real settings."""
    if candidate.device_rule is _competing:
        return f"{_loader_workers(facts)} workers + {facts.get('threads', 1)} threads > {cores} cores"
    if candidate.device_rule is _host_bound:
        return "host-bound step (CPU)"
    if candidate.name == "fused_optimizer":
        opt = next(opt for opt in facts["optimizers"] if opt.get("fused_supported"))
        return f"this torch runs fused for {opt.get('class')} on {opt.get('device', 'cpu')} (probed)"
    return f"device {facts.get('device', 'cpu')}"


def combine(fixes: list[Fix]) -> Fix:
    """One fix with all of ``fixes``; for a key two of them set (two compile modes), the first wins."""
    merged: Fix = {}
    for fix in fixes:
        for key, value in fix.items():
            if isinstance(value, dict):
                group = merged.setdefault(key, {})
                if key == "optimizer" and group:  # foreach and fused exclude each other
                    continue
                for inner, inner_value in value.items():
                    group.setdefault(inner, inner_value)
            else:
                merged.setdefault(key, value)
    return merged
