"""What holds the memory peak: findings on the capture's split of it by category and module (``MemorySplit``)."""

from __future__ import annotations

from ..result.memory_split import MemorySplit, ModuleActivations
from . import thresholds
from .common import pct
from .rule import Docs, JobContext, NotJudged, Outcome, Rule

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

RULES = (ACTIVATIONS_DOMINATE_PEAK,)
