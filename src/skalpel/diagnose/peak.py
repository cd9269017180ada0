"""What holds the memory peak: activations (the capture's split of it by category and module, ``MemorySplit``) and
the caching allocator's reserve beyond it (the trace's memory curve)."""

from __future__ import annotations

from ..result.memory_split import MemorySplit, ModuleActivations
from . import thresholds
from .common import pct
from .rule import Context, Docs, JobContext, NotJudged, Outcome, Rule

MIB = 2**20
_NO_SPLIT = ("no split of the memory peak: `skalpel run` and `skalpel.profile()` make it from the live "
             "profiler (profile_memory, record_shapes and with_stack on); a stored trace does not hold the "
             "categories")  # fmt: skip


def checkpoint_saving(module: ModuleActivations) -> int:
    """Bytes off the peak if each call of ``module`` is checkpointed: its activations go, but each call's output
    stays (the next call's input, kept by the checkpoint) and one call's are recomputed at a time in backward."""
    return max(module.bytes - module.output_bytes - module.largest_call_bytes, 0)


def _check_activations(ctx: JobContext, rule: Rule) -> Outcome:
    split: MemorySplit | None = ctx.capture.memory_split if ctx.capture is not None else None
    if split is None:
        return NotJudged(_NO_SPLIT, applies=ctx.capture is not None)
    limits = rule.thresholds
    activations = split.bytes_of("activation")
    share = 100.0 * split.share("activation")
    if share < limits.share_pct or activations < limits.floor * MIB:
        return []
    repeated = [m for m in split.activation_modules if m.calls >= limits.param("min_calls") and m.location]
    if not repeated:
        return []
    module = max(repeated, key=checkpoint_saving)
    saving = checkpoint_saving(module)
    if pct(saving, split.peak_bytes) < limits.param("min_saving_pct"):
        return []
    evidence = {
        "share_pct": share,
        "activation_mib": activations / MIB,
        "peak_mib": split.peak_bytes / MIB,
        "phase": split.phase,
        "device": split.device,
        "module": module.module,
        "module_calls": module.calls,
        "module_activation_mib": module.bytes / MIB,
        "saving_mib": saving / MIB,
        "saving_pct": pct(saving, split.peak_bytes),
        "categories_mib": {part.category: part.bytes / MIB for part in split.categories},
    }
    fix = (f"wrap each {module.module} call in torch.utils.checkpoint.checkpoint({module.module.lower()}, x, "
           f"use_reentrant=False): about {saving / MIB:.0f} MiB ({evidence['saving_pct']:.0f}%) off the peak, for "
           f"one more forward of each {module.module} in backward")  # fmt: skip
    return [rule.finding(evidence, locations=(module.location,), fix=fix, severity=rule.severity_for(share))]


ACTIVATIONS_DOMINATE_PEAK = Rule(
    id="activations_dominate_peak",
    family="memory",
    severity="warning",
    title="Activations are {share_pct:.0f}% of the {peak_mib:.0f} MiB memory peak on {device} (in {phase}); "
    "{module_calls} {module} calls hold {module_activation_mib:.0f} MiB: checkpointing them saves about "
    "{saving_mib:.0f} MiB",
    thresholds=thresholds.ACTIVATIONS_DOMINATE_PEAK,
    check=_check_activations,
    scope="job",
    fix="activation checkpointing (torch.utils.checkpoint) on the repeated blocks named",
    docs=Docs(
        what="At the peak of the recorded window's memory, the tensors torch.profiler's categoriser calls "
        "activations (kept by autograd for the backward pass) hold `share_pct` of the bytes and `floor` MiB or "
        "more, and one kind of module called `min_calls` times or more (a transformer's blocks) produced enough of "
        "them that checkpointing it would take `min_saving_pct` of the peak off. The split is made by `skalpel "
        "run` from the live profiler (profile_memory, record_shapes, with_stack), at the instant the tracked "
        "bytes peak; each activation is charged to the child of the outermost module whose forward allocated it.",
        why="The peak decides the batch and sequence length that fit. Activations grow with both, the weights "
        "and optimizer state do not: when activations dominate, recomputing them in backward (about one more "
        "forward, some 30% more compute) buys the memory that a larger batch or a longer context needs.",
        evidence="The activations' share and MiB, the peak, the phase it fell in (forward, backward, optimizer), "
        "the device, every category's MiB, the module with the largest saving, its calls and activation MiB, and "
        "the saving: its activations less each call's output (the next call's input, which the checkpoint keeps) "
        "and less its largest call's (recomputed in backward, one call at a time). The location is the module's "
        "forward.",
        fix="`torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)` around each call of the module "
        "named (or `checkpoint_sequential`; FSDP and transformers models have their own switch, e.g. "
        "`model.gradient_checkpointing_enable()`); checkpoint every other block to trade less compute for less "
        "memory saved.",
        false_positives="Inference, or a model whose peak is its weights, optimizer state or one temporary, is "
        "not reported: activations must hold most of the peak. A peak on a host with memory to spare may not be "
        "worth the extra compute; the saving is an estimate from the peak's tensors (the measured drop on "
        "examples/scenarios/activations_peak.py is in docs/findings.md).",
    ),
)



def _check_optimizer_state(ctx: JobContext, rule: Rule) -> Outcome:
    split: MemorySplit | None = ctx.capture.memory_split if ctx.capture is not None else None
    if split is None:
        return NotJudged(_NO_SPLIT, applies=ctx.capture is not None)
    limits = rule.thresholds
    state, parameters = split.bytes_of("optimizer_state"), split.bytes_of("parameter")
    share = 100.0 * split.share("optimizer_state")
    if share < limits.share_pct or state < limits.floor * MIB:
        return []
    per_parameter = state / parameters if parameters else None
    two_values = per_parameter is not None and per_parameter >= limits.param("two_value_ratio")
    saving = state // 2 if two_values else 0  # one value per parameter instead of two
    evidence = {
        "share_pct": share,
        "state_mib": state / MIB,
        "parameter_mib": parameters / MIB,
        "state_per_parameter": per_parameter,
        "peak_mib": split.peak_bytes / MIB,
        "phase": split.phase,
        "device": split.device,
        "one_value_saving_mib": saving / MIB,
    }
    fix = (f"a one-value state (SGD with momentum, Adafactor's factored moments) holds about {saving / MIB:.0f} MiB "
           "less; an 8-bit state (bitsandbytes' Adam8bit) a quarter of it; or shard it across ranks (ZeRO, FSDP)"
           if two_values else "shard the optimizer state across ranks (ZeRO, FSDP) or keep it in 8 bits")  # fmt: skip
    return [rule.finding(evidence, fix=fix, severity=rule.severity_for(share))]


OPTIMIZER_STATE_DOMINATES_PEAK = Rule(
    id="optimizer_state_dominates_peak",
    family="memory",
    severity="warning",
    title="The optimizer's state is {share_pct:.0f}% of the {peak_mib:.0f} MiB memory peak on {device} "
    "({state_mib:.0f} MiB beside {parameter_mib:.0f} MiB of parameters)",
    thresholds=thresholds.OPTIMIZER_STATE_DOMINATES_PEAK,
    check=_check_optimizer_state,
    scope="job",
    fix="a lighter optimizer state (one value per parameter, 8 bits) or sharding it",
    docs=Docs(
        what="At the peak of the recorded window's memory, the tensors torch.profiler's categoriser calls "
        "optimizer state (kept by the optimizer between steps: Adam's two moving averages, SGD's momentum) hold "
        "`share_pct` of the bytes and `floor` MiB or more. With `two_value_ratio` state bytes per parameter byte "
        "or more the state keeps two values per parameter (Adam, AdamW), and the finding claims what one value "
        "would save: half the state.",
        why="Adam's state is twice the weights and stays for the whole run; with small batches it, not the "
        "activations, decides whether a model fits. Smaller batches or checkpointing do not touch it.",
        evidence="The state's share and MiB, the parameters' MiB and the state bytes per parameter byte, the peak "
        "and its phase, the device, and the saving of a one-value state (0 when the state has one already).",
        fix="A one-value state: SGD with momentum, Adafactor (factored second moments), or Adam with 8-bit states "
        "(bitsandbytes' `Adam8bit`: a quarter of the bytes); shard the state across ranks (ZeRO stage 1, FSDP, "
        "`ZeroRedundancyOptimizer`). Which one keeps the model's quality is the user's call.",
        false_positives="A tiny batch run only to measure (a benchmark, a smoke test) shows a peak the real "
        "batch would not; the optimizer's own temporaries inside its step count as temporaries, not state. "
        "On examples/scenarios/optimizer_state_peak.py Adam's state is 48 MiB; SGD with momentum (`--momentum`) "
        "lowers the measured peak by 32 MiB against the 24 MiB claimed.",
    ),
)


def _check_reserved(ctx: Context, rule: Rule) -> Outcome:
    result = ctx.analyses.memory
    devices = [d for d in (result.devices if result is not None else ()) if d.peak_reserved_bytes is not None]
    if not devices:
        on_device = result is not None and any(d.device != "cpu" for d in result.devices)  # the host reserves none
        return NotJudged("no reserved bytes in the trace's memory events (Total Reserved): only a device's caching "
                         "allocator reports them", applies=on_device)  # fmt: skip
    limits = rule.thresholds
    findings = []
    for device in devices:
        reserved, allocated = device.peak_reserved_bytes or 0, device.peak_bytes
        gap = reserved - allocated
        if gap < limits.floor * MIB or pct(gap, reserved) < limits.share_pct:
            continue
        capacity = device.capacity_bytes
        tight = capacity is not None and pct(reserved, capacity) >= limits.param("tight_capacity_pct")
        evidence = {
            "gap_mib": gap / MIB,
            "gap_pct": pct(gap, reserved),
            "reserved_peak_mib": reserved / MIB,
            "allocated_peak_mib": allocated / MIB,
            "capacity_mib": capacity / MIB if capacity else None,
            "reserved_of_capacity_pct": pct(reserved, capacity) if capacity else None,
            "device": device.device,
        }
        findings.append(rule.finding(evidence, severity="warning" if tight else "info", rank=device.rank))
    return findings


RESERVED_FAR_ABOVE_ALLOCATED = Rule(
    id="reserved_far_above_allocated",
    family="memory",
    severity="info",
    title="The allocator reserved {reserved_peak_mib:.0f} MiB on {device} but never held more than "
    "{allocated_peak_mib:.0f} MiB at once: {gap_mib:.0f} MiB ({gap_pct:.0f}%) reserved and unused",
    thresholds=thresholds.RESERVED_FAR_ABOVE_ALLOCATED,
    check=_check_reserved,
    needs_device=True,
    fix="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments that grow in place instead of new ones beside "
    "fragments); keep tensor shapes fixed from step to step",
    docs=Docs(
        what="On a device, the caching allocator's highest reserved bytes (`Total Reserved` of the trace's memory "
        "events) exceed the highest allocated bytes by `share_pct` of the reserve and `floor` MiB or more: memory "
        "taken from the device that no moment of the recording needed. A warning where the reserve fills "
        "`tight_capacity_pct` of the device's memory (`deviceProperties`), info otherwise.",
        why="Reserved memory is what the device has given away: an out-of-memory error comes when a new segment "
        "cannot be had, even with gigabytes free inside the reserved ones. Blocks of changing sizes leave holes "
        "no later request fits (fragmentation), and the reserve grows around them.",
        evidence="The gap in MiB and as a share of the reserved peak, the reserved and allocated peaks, the "
        "device's memory and the reserve's share of it, the device.",
        fix="`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` lets segments grow in place; fixed shapes (pad "
        "batches to a few sizes) make blocks reusable; a memory snapshot (`torch.cuda.memory._dump_snapshot`, "
        "then `skalpel analyze snap.pickle`) shows the free blocks inside each segment and the largest one. "
        "`torch.cuda.empty_cache()` only hands back whole free segments, at the cost of allocating them again.",
        false_positives="A higher peak before the recording (an evaluation, the first steps, a model load) "
        "leaves its segments reserved for reuse: the cache doing its job, not fragments. A cache that holds "
        "freed blocks at about the allocated peak stays below the share. Memory reserved by other pools (CUDA "
        "graphs' private pools) counts as reserved too.",
    ),
)

def _check_gradients(ctx: JobContext, rule: Rule) -> Outcome:
    split: MemorySplit | None = ctx.capture.memory_split if ctx.capture is not None else None
    if split is None:
        return NotJudged(_NO_SPLIT, applies=ctx.capture is not None)
    without = split.peak_without_spent_gradients_bytes
    if without is None or split.spent_gradient_bytes is None:
        return NotJudged("the split holds no replay of the spent gradients (a report of an older skalpel)",
                         applies=False)  # fmt: skip
    limits = rule.thresholds
    saving = max(split.peak_bytes - without, 0)
    if saving < limits.floor * MIB or pct(saving, split.peak_bytes) < limits.share_pct:
        return []
    evidence = {
        "saving_mib": saving / MIB,
        "saving_pct": pct(saving, split.peak_bytes),
        "peak_mib": split.peak_bytes / MIB,
        "peak_without_mib": without / MIB,
        "spent_gradient_mib": split.spent_gradient_bytes / MIB,
        "gradient_mib": split.bytes_of("gradient") / MIB,
        "phase": split.phase,
        "device": split.device,
    }
    where = f" at {split.zero_grad_location}" if split.zero_grad_location else ""
    fix = (f"make the zero_grad{where} zero_grad(set_to_none=True) (the default since torch 2.0) and call it right "
           f"after optimizer.step() or at the top of the step, before the forward: the gradients go once the step "
           f"has read them, about {saving / MIB:.0f} MiB ({evidence['saving_pct']:.0f}%) off the peak")  # fmt: skip
    locations = (split.zero_grad_location,) if split.zero_grad_location else ()
    return [rule.finding(evidence, locations=locations, fix=fix)]


GRADIENTS_HELD_AT_PEAK = Rule(
    id="gradients_held_at_peak",
    family="memory",
    severity="warning",
    title="{spent_gradient_mib:.0f} MiB of gradients no step reads any more are held at the {peak_mib:.0f} MiB "
    "memory peak on {device} (in {phase}): freeing them at zero_grad lowers it to {peak_without_mib:.0f} MiB",
    thresholds=thresholds.GRADIENTS_HELD_AT_PEAK,
    check=_check_gradients,
    scope="job",
    fix="optimizer.zero_grad(set_to_none=True) right after optimizer.step(), before the next forward",
    docs=Docs(
        what="Gradients are held while nothing will read them: after the optimizer step that used them until the "
        "zero_grad that clears them (zero_grad called after the next forward), or as zeros after "
        "`zero_grad(set_to_none=False)` until the next backward writes them. `skalpel run` replays the categoriser's "
        "timeline of the recorded window with those gradients freed over those stretches; the finding fires when "
        "that lowers the window's peak by `share_pct` of it and `floor` MiB or more.",
        why="Gradients are as large as the weights. Held through the forward, they sit beside the activations "
        "that set the peak; with set_to_none=True a backward creates each gradient when it first writes it (and "
        "reuses its own output buffer), so nothing is held before then.",
        evidence="The saving (the peak less the replayed peak) in MiB and as a share of the peak, the peak and the "
        "replayed peak, the spent gradients' MiB at the peak and all gradients' MiB there, the phase of the peak and "
        "the device. The location is the user's zero_grad call that cleared them.",
        fix="`optimizer.zero_grad(set_to_none=True)` (the default since torch 2.0; `model.zero_grad()` too) at the "
        "top of the step or right after `optimizer.step()`, never between the forward and the backward. Code that "
        "reads `.grad` after zero_grad must then handle None.",
        false_positives="Gradient accumulation keeps the gradients of earlier micro-batches for the next backward: "
        "they are read again, never spent, and the finding stays quiet (examples/scenarios/gradients_held_peak.py "
        "--accumulate). The replay is conservative: with set_to_none=True the backward also skips the temporary it "
        "adds into an existing gradient, which the replay keeps, so the measured drop is larger than the claim "
        "(docs/findings.md).",
    ),
)

RULES = (ACTIVATIONS_DOMINATE_PEAK, OPTIMIZER_STATE_DOMINATES_PEAK, GRADIENTS_HELD_AT_PEAK,
         RESERVED_FAR_ABOVE_ALLOCATED)
