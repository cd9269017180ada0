"""hot_module: a module of the user's runs a chain of small ops of its own that holds the step.

``hot_op`` names one op that holds the step. A hand-written activation or attention spreads the same time
over several ops, none of them large: makemore's ``NewGELU`` (``0.5 * x * (1 + tanh(...(x + 0.044715 *
pow(x, 3))))``) runs a mul, add, tanh and pow per call, each a few percent of the step, together a fifth of
it in the forward alone. Judged on CPU-only runs from the module tree (``analysis/modules.py``): the instances
of one module class path (``Transformer > Block > NewGELU`` x4) whose forward is the user's code, their self
host time (their own ops, forward and backward, child modules left out) against the step less one-time work, and the op names
placed in that class path (``OpPlace``). Several op names make it a chain that a fused op or torch.compile
can make one kernel; a single op is ``hot_op``'s to judge.
"""

from __future__ import annotations

from collections import defaultdict

from ..analysis.modules import ModuleNode, RankModules
from . import thresholds
from .common import pct
from .rule import Context, Docs, NotJudged, Outcome, Rule

# The fused op torch has for a chain, by the op names the chain runs (all must be placed in the module).
_FUSED = (
    ({"aten::tanh", "aten::pow"}, "the tanh approximation of GELU: torch.nn.functional.gelu(x, approximate='tanh')"),
    ({"aten::erf"}, "GELU: torch.nn.functional.gelu(x)"),
    ({"aten::sigmoid", "aten::mul"}, "SiLU / swish: torch.nn.functional.silu(x)"),
    ({"aten::softmax", "aten::matmul"}, "attention: torch.nn.functional.scaled_dot_product_attention(q, k, v, "
     "is_causal=...) in place of the scores, mask, softmax and weighted sum"),
    ({"aten::_softmax", "aten::bmm"}, "attention: torch.nn.functional.scaled_dot_product_attention(q, k, v, "
     "is_causal=...) in place of the scores, mask, softmax and weighted sum"),
    ({"aten::rsqrt", "aten::mean"}, "a normalisation: torch.nn.functional.rms_norm or layer_norm"),
    ({"aten::var", "aten::mean"}, "a normalisation: torch.nn.functional.layer_norm"),
)


def _check_hot_module(ctx: Context, rule: Rule) -> Outcome:
    if ctx.analyses.has_device:
        return NotJudged("judged on CPU-only runs (on a device, launch_bound names many small kernels)",
                         applies=False)  # fmt: skip
    tree = ctx.analyses.modules
    ledger = ctx.analyses.ledger
    if tree is None or ledger is None:
        return NotJudged("no module frames in the trace (skalpel run records them; torch.profiler with_stack=True "
                         "or with_modules=True)", applies=False)  # fmt: skip
    findings = []
    for rank, modules in tree.ranks.items():
        rank_ledger = ledger.for_rank(rank)
        host = rank_ledger.lane("host") if rank_ledger is not None else None
        if host is None:
            continue
        step_ms = host.steady_ms_per_unit
        found = _heaviest_chain(modules, step_ms, rule, host)
        if found is not None:
            findings.append(_finding(rule, rank, rank_ledger.describe(), step_ms, *found))
    return findings


def _heaviest_chain(modules: RankModules, step_ms: float, rule: Rule, host):
    """The user module class path with the most self time a step, if it passes the thresholds (in the typical unit
    of the ledger's ``host`` lane too) and runs several op names of its own: (its nodes, self ms a step, its op
    names)."""
    if step_ms <= 0:
        return None
    by_class: dict[str, list[ModuleNode]] = defaultdict(list)
    for node in modules.nodes:
        if node.user_forward:
            by_class[node.class_path].append(node)
    if not by_class:
        return None
    path, nodes = max(by_class.items(), key=lambda item: sum(_own_ms(node) for node in item[1]))
    self_ms = sum(_own_ms(node) for node in nodes)
    limits = rule.thresholds
    if pct(self_ms, step_ms) < limits.share_pct or self_ms < limits.floor:
        return None
    if _typical_share_pct(nodes, host) < limits.share_pct:
        return None  # it holds some units, not the step: a call the scheduler stalled, or a unit unlike the others
    ops = [place.op for place in modules.places.values() if place.module == path]  # heaviest first, as placed
    if len(ops) < limits.param("min_ops"):
        return None  # one op: hot_op's; none placed: nothing to name
    return nodes, self_ms, ops


def _typical_share_pct(nodes: list[ModuleNode], host) -> float:
    """The nodes' own time against each unit's time less its one-time work, the median over the units (the tree and
    the ledger judge the same units); 100 where the tree kept no time by unit (the mean share then stands alone)."""
    if {len(node.own_ms_by_unit) for node in nodes} != {len(host.units)}:
        return 100.0
    typical = host.typical_share_pct([sum(times) for times in zip(*(node.own_ms_by_unit for node in nodes))])
    return typical if typical is not None else 100.0


def _own_ms(node: ModuleNode) -> float:
    """A module's own ops a unit, forward and the backward autograd charges to it (child modules left out)."""
    return node.host_self_ms + node.backward_host_self_ms


def _finding(rule: Rule, rank: int, judged_over: str, step_ms: float, nodes: list[ModuleNode], self_ms: float,
             ops: list[str]):  # fmt: skip
    lead = nodes[0]
    share = pct(self_ms, step_ms)
    calls = sum(node.calls for node in nodes)
    fused = next((words for names, words in _FUSED if names <= set(ops)), None)
    evidence = {
        "module": lead.class_path,
        "instances": len(nodes),
        "share_pct": share,
        "ms_per_step": self_ms,
        "forward_ms_per_step": sum(node.host_self_ms for node in nodes),
        "calls_per_step": calls,
        "ms_per_call": self_ms / max(calls, 1e-9),
        "ops": ops,
        "step_ms": step_ms,
        "judged_over": judged_over,
        "fused_op": fused,
    }
    times = f" ×{len(nodes)}" if len(nodes) > 1 else ""
    title = (f"A module's own ops hold the step: {lead.class_path}{times} runs {len(ops)} op names of its own "
             f"({', '.join(ops[:4])}{', ...' if len(ops) > 4 else ''}), {share:.0f}% of the step, forward and "
             f"backward ({self_ms:.1f} ms/step)")  # fmt: skip
    chain = f"{lead.path[-1].rsplit('_', 1)[0]}.forward ({lead.location})"
    fix = (f"{chain} runs a chain of small ops, each a pass over memory, and autograd keeps each one's input for "
           "its backward: " + (f"torch has a fused op for this, {fused}; " if fused else "")
           + "or torch.compile the module (or the model) to fuse the chain into one kernel")  # fmt: skip
    return rule.finding(evidence, locations=(lead.location,), rank=rank, title=title, fix=fix,
                        severity=rule.severity_for(share))  # fmt: skip


HOT_MODULE = Rule(
    id="hot_module",
    family="device",
    severity="warning",
    title="A module's own ops hold the step: {module} takes {share_pct:.0f}% of it ({ms_per_step:.1f} ms/step)",
    thresholds=thresholds.HOT_MODULE,
    check=_check_hot_module,
    fix="a fused op for the chain (GELU, SiLU, attention, a normalisation), or torch.compile to fuse it",
    docs=Docs(
        what="On a CPU-only run, the instances of one module class of the user's (its forward is the user's code) "
        "spend share_pct of the step or more in their own ops (child modules left out), over min_ops op names or "
        "more: a hand-written activation, normalisation or attention run as a chain of small ops.",
        why="No single op of the chain is large, so hot_op stays quiet and the step breakdown says cpu_exec; the "
        "chain still costs one pass over the activations per op, forward and backward, and keeps each op's input "
        "alive for the backward. Torch's fused op (F.gelu, F.silu, scaled_dot_product_attention, layer_norm) or a "
        "compiled module does the same in one pass.",
        evidence="`module` (the class path), `instances`, `share_pct` of the step less one-time work (the ledger's "
        "host lane), `ms_per_step` of the module's own ops, forward and the backward autograd charges to it (the "
        "module tree's self times), `forward_ms_per_step`, `calls_per_step`, `ops` (the op names the tree places mostly in that class path), `fused_op` where the ops "
        "match a chain torch has one op for. The location is the module's forward.",
        fix="Replace the chain by torch's fused op where one exists (the finding names it when the op names match), "
        "else torch.compile the module or the model: its elementwise chains become one kernel.",
        false_positives="A module whose own ops are the model's real work (a hand-written convolution or "
        "matrix multiply) has nothing to fuse. A trace without autograd's sequence numbers charges no backward "
        "to modules: the share is then the forward's alone, and the whole cost larger.",
    ),
)

RULES = (HOT_MODULE,)
