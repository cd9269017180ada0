"""What held memory at the peak of a recorded window: torch.profiler's own categoriser, read before the results go.

``torch.profiler._memory_profiler.MemoryProfile`` (the model behind ``export_memory_timeline``) needs
``profile_memory``, ``record_shapes`` and ``with_stack``; it ties each allocation to a tensor and each tensor
version to a category. Its timeline is replayed here: the instant the live bytes peak, each live tensor's
bytes go to its category (``unknown`` when none), the phase is read from the ops around the allocation that
set the peak, and each activation is charged to the module whose forward allocated it (the child of the
outermost module: a transformer's block, the unit activation checkpointing wraps).

The CPU allocator reports no free of a block allocated before the recording started (it never learnt its
size): a tensor alive when the window opens and freed in it would stay in the timeline to the end. A window
opened by a ``zero_grad()`` between the forward and the backward holds the whole previous forward's
activations that way. Such a tensor is taken as freed after its last use in the window
(``_released_after_last_use``), unless it is model state (parameters, optimizer state), held across steps.

The categoriser is pure Python over every op of the window (some 2.5 s for two steps of a small transformer
on one loaded core, 6,000 events a second): a window of more than ``MOST_EVENTS`` profiler events is left
unsplit, and the report says so.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

from ..result.memory_split import CategoryBytes, MemorySplit, ModuleActivations
from ..trace.roles import BACKWARD_PREFIX, OPTIMIZER_PREFIX, ZERO_GRAD_PREFIX
from ..trace.stacks import format_location, is_user_file, parse_frame
from .stale_gradients import StaleGradients, intervals, is_optimizer_step, is_zero_grad, replay

CURVE_POINTS = 240  # rows of the category curve kept for the report's chart
MOST_EVENTS = 60_000  # profiler events above which the categoriser is not run: some 10 s on one loaded core
EVENTS_PER_S = 6_000  # the categoriser's pace on one loaded core (53,721 events in 8.9 s)
SAY_FROM_EVENTS = 12_000  # a split of some 2 s or more is announced: the script stands still meanwhile
TOP_MODULES = 8
_MODULE_PREFIX = "nn.Module: "
# torch.optim's Python frames: the optimizer step's record_function is not always an ancestor of its allocations
# in the profiler's tree (torch 2.13: the allocations hang under the Python frames of optimizer.py and adam.py)
_OPTIM_FRAME = "torch/optim/"


class NotSplit(Exception):
    """The window's memory cannot be split; the message says why, for the report's notes."""


def split_at_peak(prof: Any, *, steps: int, top_modules: int = TOP_MODULES,
                  say: Callable[[str], None] | None = None) -> MemorySplit:  # fmt: skip
    """The split of the window ``prof`` recorded (its results not yet released), or NotSplit; ``say`` hears, before
    a split of some seconds, what it is doing and for about how long."""
    missing = [flag for flag in ("profile_memory", "record_shapes", "with_stack") if not getattr(prof, flag, False)]
    if missing:
        raise NotSplit(f"memory not split by category: the capture ran without {', '.join(missing)}")
    results = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    if results is None:
        raise NotSplit("memory not split by category: the profiler kept no results")
    events = len(results.events())
    if events > MOST_EVENTS:
        raise NotSplit(f"memory not split by category: {events:,} profiler events in the window, more than the "
                       f"{MOST_EVENTS:,} the categoriser is run on (record fewer steps: --active)")  # fmt: skip
    if say is not None and events >= SAY_FROM_EVENTS:
        say(f"splitting the memory peak by category ({events:,} profiler events, about "
            f"{events / EVENTS_PER_S:.0f} s; fewer --active steps make it shorter)")  # fmt: skip
    try:
        return _split(results, steps=steps, top_modules=top_modules)
    except NotSplit:
        raise
    except Exception as error:  # torch's private categoriser (its API moves between versions): the split, not the run
        raise NotSplit(f"memory not split by category: torch's categoriser failed ({type(error).__name__}: "
                       f"{str(error)[:120]})") from None  # fmt: skip


def _split(results: Any, *, steps: int, top_modules: int) -> MemorySplit:
    from torch._C._profiler import _EventType
    from torch.profiler._memory_profiler import Action, MemoryProfile, TensorKey

    profile = MemoryProfile(results)
    timeline = _released_after_last_use(profile, Action, TensorKey)
    name_of = _namer(profile, timeline, Action, TensorKey)
    device = _peak_device(timeline, Action)
    live, at, held_before = _live_at_peak(timeline, device, Action)
    by_category: dict[str, int] = defaultdict(int)
    activations = []
    for (key, version), size in live.items():
        name = name_of(key, version)
        by_category[name] += size
        if name == "activation":
            activations.append((key, size))
    allocations = _allocations(profile, _EventType, TensorKey)
    peak = sum(live.values())
    categories = tuple(CategoryBytes(category=name, bytes=size)
                       for name, size in sorted(by_category.items(), key=lambda item: (-item[1], item[0])))  # fmt: skip
    names = tuple(part.category for part in categories)
    stale = _stale_gradients(profile, timeline, device, Action, TensorKey)
    names += tuple(sorted(set(_category_names(timeline, device, profile, name_of, TensorKey)) - set(names)))
    return MemorySplit(
        device=str(device), peak_bytes=peak, held_before_bytes=held_before,
        phase=_phase(allocations.get(at)), categories=categories,
        activation_modules=_by_module(activations, allocations, _EventType)[:top_modules], step_span=steps,
        curve_categories=names, curve=_curve(timeline, device, names, name_of, Action),
        spent_gradient_bytes=stale.at_peak_bytes, peak_without_spent_gradients_bytes=stale.peak_without_bytes,
        zero_grad_location=_caller_line(stale.zero_grad_event),
    )  # fmt: skip


_HELD_ACROSS_STEPS = ("parameter", "optimizer_state")


def _namer(profile: Any, timeline: tuple, action: Any, tensor_key: Any) -> Callable[[Any, int], str]:
    """The category name of a tensor version, as the categoriser has it, except that an "activation" freed in the
    window with no backward op reading it is a temporary: the categoriser calls every forward tensor derived from
    the inputs an activation, also a no_grad forward's (an evaluation) and intermediates autograd did not keep,
    which checkpointing cannot free."""
    from torch.profiler._memory_profiler import RecordScope, get_scopes

    read_in_backward = {key for node in profile._data_flow_graph.flow_nodes
                        if RecordScope.BACKWARD_FUNCTION in get_scopes(node._event) for key in node.inputs}  # fmt: skip
    freed = {key for _, act, (key, _), _ in timeline if act == action.DESTROY}

    def name_of(key: Any, version: int) -> str:
        category = profile._categories.get(key, version) if isinstance(key, tensor_key) else None
        name = category.name.lower() if category is not None else "unknown"
        if name == "activation" and key in freed and key not in read_in_backward:
            return "temporary"
        return name

    return name_of


def _released_after_last_use(profile: Any, action: Any, tensor_key: Any) -> tuple:
    """The categoriser's timeline with a DESTROY, after its last use in the window, for each host tensor that was
    alive before the window and never freed in it (the CPU allocator reports no such free), model state aside."""
    timeline = profile.timeline
    destroyed = {key for _, act, (key, _), _ in timeline if act == action.DESTROY}
    versions: dict = {}
    for _, act, (key, version), _ in timeline:
        if act == action.INCREMENT_VERSION:
            versions[key] = max(versions.get(key, 0), version + 1)
    unfreed = {key: size for _, act, (key, _), size in timeline
               if act == action.PREEXISTING and key.device.type == "cpu" and key not in destroyed
               and isinstance(key, tensor_key)}  # fmt: skip
    if not unfreed:
        return timeline
    last_use: dict = {}
    for node in profile._data_flow_graph.flow_nodes:
        for key in node.inputs:
            if key in unfreed:
                last_use[key] = max(last_use.get(key, -1), node._event.end_time_ns)
    released = []
    for key, size in unfreed.items():
        last = versions.get(key, 0)
        categories = {profile._categories.get(key, version) for version in range(last + 1)}
        if not any(c is not None and c.name.lower() in _HELD_ACROSS_STEPS for c in categories):
            # no use in the window: dropped at its start (old gradients a zero_grad(set_to_none=True) let go)
            released.append((last_use.get(key, -1), action.DESTROY, (key, last), size))
    return tuple(sorted((*timeline, *released), key=lambda entry: (entry[0], entry[1].value)))


def _stale_gradients(profile: Any, timeline: tuple, device: Any, action: Any, tensor_key: Any) -> StaleGradients:
    """The peak the window would have had with its spent gradients freed (``stale_gradients.py``)."""
    entries = [entry for entry in timeline if entry[2][0].device == device]
    _, peak_index = _peak_of(entries, action)

    def is_gradient(key: Any, version: int) -> bool:
        category = profile._categories.get(key, version) if isinstance(key, tensor_key) else None
        return category is not None and category.name.lower() == "gradient"

    nodes = profile._op_tree.sorted_nodes
    return replay(entries, is_gradient, intervals(nodes, is_optimizer_step), intervals(nodes, is_zero_grad), action,
                  peak_index)  # fmt: skip


def _caller_line(event: Any) -> str | None:
    """The innermost user line among the Python frames around ``event`` (the user's zero_grad call)."""
    while event is not None:
        line = _user_line(event.name)
        if line is not None:
            return line
        event = event.parent
    return None


def _peak_device(timeline: tuple, action: Any) -> Any:
    """The device whose tracked bytes peak highest (a GPU's over the host's buffers, as a rule)."""
    level: dict[Any, int] = defaultdict(int)
    peak: dict[Any, int] = defaultdict(int)
    for _, act, (key, _version), size in timeline:
        if act in (action.PREEXISTING, action.CREATE):
            level[key.device] += size
        elif act == action.DESTROY:
            level[key.device] -= size
        peak[key.device] = max(peak[key.device], level[key.device])
    if not peak:
        raise NotSplit("memory not split by category: no allocation was recorded in the window")
    return max(peak, key=lambda device: (peak[device], device.type != "cpu"))


def _live_at_peak(timeline: tuple, device: Any, action: Any) -> tuple[dict, int, int]:
    """(live (key, version) -> bytes at the peak, the time of the allocation that set it, bytes of those allocated
    before the window)."""
    entries = [entry for entry in timeline if entry[2][0].device == device]
    _, peak_index = _peak_of(entries, action)
    live: dict = {}
    for time, act, (key, version), size in entries[: peak_index + 1]:
        if act in (action.PREEXISTING, action.CREATE):
            live[(key, version)] = size
        elif act == action.INCREMENT_VERSION:
            live[(key, version + 1)] = live.pop((key, version), size)
        elif act == action.DESTROY:
            live.pop((key, version), None)
    at = entries[peak_index][0] if peak_index >= 0 else -1
    preexisting = {entry[2][0] for entry in entries if entry[1] == action.PREEXISTING}
    held_before = sum(size for (key, _), size in live.items() if key in preexisting)  # and still held at the peak
    return live, at, held_before


def _peak_of(entries: list, action: Any) -> tuple[int, int]:
    """(the highest live bytes, the index of the entry that first reached them; -1 when none)."""
    level = peak = 0
    peak_index = -1
    for index, (_, act, _, size) in enumerate(entries):
        if act in (action.PREEXISTING, action.CREATE):
            level += size
        elif act == action.DESTROY:
            level -= size
        if level > peak:
            peak, peak_index = level, index
    return peak, peak_index


def _curve(timeline: tuple, device: Any, names: tuple[str, ...], name_of: Callable[[Any, int], str],
           action: Any) -> tuple[tuple[float, ...], ...]:  # fmt: skip
    """The live bytes of each category over the window, at CURVE_POINTS instants and at the peak's."""
    index = {name: i for i, name in enumerate(names)}
    entries = [entry for entry in timeline if entry[2][0].device == device]
    times = [entry[0] for entry in entries if entry[0] >= 0]
    if not times:
        return ()
    start, end = min(times), max(times)
    every = max((end - start) / CURVE_POINTS, 1)
    level = [0] * len(names)
    rows: list[tuple[float, ...]] = []
    next_at = start
    highest, peak_row = -1, None

    def add(key: Any, version: int, size: int) -> None:
        slot = index.get(name_of(key, version))
        if slot is not None:
            level[slot] += size

    for time, act, (key, version), size in entries:
        if act in (action.PREEXISTING, action.CREATE):
            add(key, version, size)
        elif act == action.INCREMENT_VERSION:
            add(key, version, -size)
            add(key, version + 1, size)
        elif act == action.DESTROY:
            add(key, version, -size)
        row = None
        if sum(level) > highest:
            highest, row = sum(level), _row(time, start, level)
            peak_row = row
        if time >= next_at:
            rows.append(row or _row(time, start, level))
            next_at = time + every
    if peak_row is not None and peak_row not in rows:
        rows.append(peak_row)
    return tuple(sorted(rows, key=lambda row: row[0]))


def _category_names(timeline: tuple, device: Any, profile: Any, name_of: Callable[[Any, int], str],
                    tensor_key: Any):  # fmt: skip
    """The category of every tensor version the window created on ``device`` (for the curve's columns)."""
    for _, _, (key, version), _ in timeline:
        if key.device == device:
            yield name_of(key, version)
            if isinstance(key, tensor_key) and profile._categories.get(key, version + 1) is not None:
                yield name_of(key, version + 1)


def _row(time: int, start: int, level: list[int]) -> tuple[float, ...]:
    return (round((max(time, start) - start) / 1e6, 3), *(round(size / 2**20, 3) for size in level))


def _allocations(profile: Any, event_type: Any, tensor_key: Any) -> dict:
    """Each allocation event by its tensor key and by its start time (the timeline's times are these)."""
    found: dict = {}
    for event in profile._op_tree.sorted_nodes:
        if event.tag == event_type.Allocation and event.extra_fields.alloc_size > 0:
            found[event.start_time_ns] = event
            key = tensor_key.from_allocation(event.extra_fields)
            if key is not None:
                found[key] = event
    return found


def _phase(event: Any) -> str:
    """forward, backward, optimizer or zero_grad: what the ops around the allocation that set the peak were doing
    (forward: inside a module's call, none of the others)."""
    module = False
    while event is not None:
        name = event.name
        if name.startswith(ZERO_GRAD_PREFIX) or (_OPTIM_FRAME in name and name.endswith(": zero_grad")):
            return "zero_grad"
        if name.startswith(OPTIMIZER_PREFIX) or _OPTIM_FRAME in name:
            return "optimizer"
        if name.startswith(BACKWARD_PREFIX) or name.startswith("autograd::engine"):
            return "backward"
        if name.startswith(_MODULE_PREFIX):
            module = True
        event = event.parent
    return "forward" if module else "other"


def _by_module(activations: list, allocations: dict, event_type: Any) -> tuple[ModuleActivations, ...]:
    """Activation bytes per module (class and forward line), largest first; each call's last one is its output."""
    calls: dict[Any, list[tuple[int, int]]] = defaultdict(list)  # module call event -> [(start ns, bytes)]
    where: dict[Any, tuple[str, str | None]] = {}
    for key, size in activations:
        event = allocations.get(key)
        call, module, location = _producer(event, event_type)
        calls[call].append((event.start_time_ns if event is not None else 0, size))
        where[call] = (module, location)
    rows: dict[tuple[str, str | None], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for call, sizes in calls.items():
        row = rows[where[call]]
        total = sum(size for _, size in sizes)
        row[0] += total
        row[1] += 1
        row[2] = max(row[2], total)
        row[3] += max(sizes)[1] if call is not None else 0
    return tuple(sorted((ModuleActivations(module=module, location=location, bytes=row[0], calls=row[1],
                                           largest_call_bytes=row[2], output_bytes=row[3])
                         for (module, location), row in rows.items()), key=lambda m: (-m.bytes, m.module)))  # fmt: skip


def _producer(event: Any, event_type: Any) -> tuple[Any, str, str | None]:
    """(the module call, its class, its forward's user line) that allocated ``event``: the outermost module's child
    (the outermost module itself when it has none); (None, '(outside any module)', innermost user line) else."""
    chain = []  # Python frames, outermost first
    parent = event.parent if event is not None else None
    while parent is not None:
        if parent.tag in (event_type.PyCall, event_type.PyCCall):
            chain.append(parent)
        parent = parent.parent
    chain.reverse()
    modules = [index for index, frame in enumerate(chain) if frame.name.startswith(_MODULE_PREFIX)]
    if not modules:
        user = [_user_line(frame.name) for frame in chain]
        return None, "(outside any module)", next((line for line in reversed(user) if line), None)
    index = modules[1] if len(modules) > 1 else modules[0]
    name = chain[index].name[len(_MODULE_PREFIX) :].rsplit("_", 1)[0]
    following = modules[modules.index(index) + 1] if modules.index(index) + 1 < len(modules) else len(chain)
    location = next((line for frame in chain[index + 1 : following] if (line := _user_line(frame.name))), None)
    return chain[index], name, location


def _user_line(name: str) -> str | None:
    parsed = parse_frame(name)
    if parsed is None or not is_user_file(parsed[0]):
        return None
    return format_location(*parsed)
