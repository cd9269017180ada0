"""The step boundary policy on event sequences, without torch: each row is a script's events, with ``|x`` where
the policy marks a boundary (``x``: the signal's first letter), as the hooks would send them.

Tokens (``NAME:ID``): ``new`` the script makes an optimizer (it keeps holding it); ``fetch`` a DataLoader
``__next__`` on a loader; ``zero`` ``optimizer.zero_grad()``; ``fwd`` a top-level module call (sent only while
module calls can mark steps: the hooks remove theirs once they cannot); ``back`` a whole ``backward()``;
``step`` a whole ``optimizer.step()`` (``step(`` its start, ``step)`` its end, for what runs inside: an LBFGS
closure); ``skip`` a ``GradScaler.step`` that skipped the optimizer's step, ``scaled`` one that did not; ``user``
``skalpel.step()``; ``thread`` an optimizer step on another thread (the hooks send nothing else from there).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from skalpel.capture.boundaries import (
    HELD_WORK_STEPS,
    LAGGING_OPTIMIZER_STEPS,
    Boundary,
    BoundaryPolicy,
    Takeover,
    why_no_boundary,
)


class _Optimizer:
    """What the script holds (the policy keeps it weakly)."""


class _Clock:
    """A millisecond per token."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


_EVENTS = {
    "fetch": lambda arg: [("fetch", arg)],
    "zero": lambda arg: [("zero_grad", arg)],
    "fwd": lambda arg: [("forward", arg)],
    "back": lambda arg: [("backward",), ("backward_done",)],
    "step": lambda arg: [("step_begins", arg), ("optimizer_begins",), ("optimizer_step", arg)],
    "step(": lambda arg: [("step_begins", arg), ("optimizer_begins",)],
    "step)": lambda arg: [("optimizer_step", arg)],
    "skip": lambda arg: [("scaler_step", arg, True)],
    "scaled": lambda arg: [("scaler_step", arg, False)],
    "user": lambda arg: [("user_step",)],
    "thread": lambda arg: [("elsewhere", arg)],
    "raw": lambda arg: [("optimizer_begins",), ("optimizer_step", arg)],  # an optimizer whose step is not wrapped
}


def replay(sequence: str, *, only: str | None = None, owner=None) -> tuple[str, BoundaryPolicy]:
    """``sequence`` with its ``|x`` marks as the policy makes them, and the policy after it."""
    clock = _Clock()
    policy = BoundaryPolicy(only, owner=owner, clock=clock)
    held: dict[str, _Optimizer] = {}
    out: list[str] = []
    for token in sequence.split():
        if token.startswith("|"):
            continue
        clock.now += 0.001
        name, _, arg = token.partition(":")
        if name == "new":
            events = [("optimizer_made", held.setdefault(arg, _Optimizer()))]
        elif name == "fwd" and not policy.module_calls_matter:
            events = []  # the module hooks are gone
        else:
            events = _EVENTS[name](arg)
        for event in events:
            result = policy.on(event)
            assert result is None or isinstance(result, (Boundary, Takeover))
            if isinstance(result, Boundary):
                out.append(f"|{'c' if result.child else result.signal[0]}")
        out.append(token)
    return " ".join(out), policy


def _check(expected: str, **options: object) -> BoundaryPolicy:
    marked, policy = replay(expected, **options)  # type: ignore[arg-type]
    assert marked == " ".join(expected.split())
    return policy


def _repeat(first: str, then: str, times: int) -> str:
    return " ".join([first] + [then] * times)


PLAIN = "fetch:a zero:O fwd:m back step:O"
GAN = "zero:D fwd:G fwd:D back step:D zero:G fwd:G fwd:D back step:G"  # D then G, each its own zero_grad
GENERATOR_FIRST = "zero:G fwd:D back step:G zero:D fwd:D fwd:D back step:D"  # after fwd:G, the generator's call
TWO_OPTIMIZERS = "fetch:a zero:E zero:H fwd:m back step:E step:H"  # an encoder's and a head's, stepped together
CRITIC_STEP = "fetch:a zero:C fwd:G fwd:C back step:C"
GENERATOR_STEP = "zero:G fwd:G fwd:C back step:G"
CRITIC = " ".join([CRITIC_STEP] * 5 + [GENERATOR_STEP])  # WGAN: 5 critic steps per generator step
LBFGS = "step(:L " + " ".join(["zero:L fwd:m back"] * 3) + " step):L"  # the closure runs inside the step
SCALED, SKIPPED = "fetch:a zero:O fwd:m back step:O scaled:O", "fetch:a zero:O fwd:m back skip:O"
MANUAL_SGD = "fwd:m back"
INFERENCE = "fetch:a fwd:m"
EVALUATION = " ".join(["fwd:m"] * 4)  # estimate_loss(): model calls under no_grad, no backward
ROLLOUT = " ".join(["fwd:p"] * 200)  # PPO: 200 policy calls under no_grad
MINIBATCH = "fwd:p zero:O back step:O"  # then 2 epochs x 4 minibatch updates
UPDATE = " ".join(["fwd:p |o zero:O back step:O"] * 8)
FIRST_UPDATE = " ".join(["fwd:p |o zero:O back step:O"] * 7)  # after its first minibatch

ROWS = {
    # name: (events with the boundaries marked, the signal that marks at the end)
    "plain loop": (_repeat(PLAIN, "|o " + PLAIN, 3), "optimizer"),
    "gan": (_repeat(GAN, "|o " + GAN, 3), "optimizer"),
    "gan, generator first": (_repeat("fwd:G " + GENERATOR_FIRST, "fwd:G |o " + GENERATOR_FIRST, 3), "optimizer"),
    "gan with a loader": (_repeat("fetch:a " + GAN, "|o fetch:a " + GAN, 3), "optimizer"),
    "two optimizers": (_repeat(TWO_OPTIMIZERS, "|o " + TWO_OPTIMIZERS, 3), "optimizer"),
    # the first iteration does not know the generator yet: each critic step is a step until it steps
    "wgan critic, 5 per generator step": (
        _repeat(" |o ".join([CRITIC_STEP] * 5) + " " + GENERATOR_STEP, "|o " + CRITIC, 3), "optimizer"),
    # the closure's zero_grad and backward run inside the step: the boundary is taken as the next step starts
    "lbfgs closure": (_repeat(LBFGS, "|o " + LBFGS, 3), "optimizer"),
    "gradscaler skips every other step": (_repeat(SCALED, f"|o {SKIPPED} |o {SCALED}", 2) + f" |o {SKIPPED}",
                                          "optimizer"),
    "manual sgd on backward": (_repeat(MANUAL_SGD, "|b " + MANUAL_SGD, 3), "backward"),
    "inference with a loader": (_repeat(INFERENCE, "|d " + INFERENCE, 3), "dataloader"),
    "inference, model calls only": ("fwd:m |f fwd:m |f fwd:m", "forward"),
    # the optimizer exists: the evaluation's model calls are held (not steps), training marks on the optimizer
    "evaluation before training": (f"new:O {EVALUATION} " + " ".join(["fwd:m back step:O |o zero:O"] * 3),
                                   "optimizer"),
    # the rollout is held the first time, then lies inside the step of the last minibatch before it
    "ppo rollout then minibatch updates": (f"new:O {ROLLOUT} {MINIBATCH} {FIRST_UPDATE} {ROLLOUT} {UPDATE}",
                                           "optimizer"),
}


@pytest.mark.parametrize("name", list(ROWS))
def test_boundaries_of_an_event_sequence(name: str) -> None:
    expected, signal = ROWS[name]
    policy = _check(expected)
    assert policy.signal == signal
    assert policy.boundaries == expected.count("|")


def test_the_rows_read_as_written() -> None:
    """The table's shorthand: the GAN row is 4 iterations, 3 boundaries, each at D's zero_grad."""
    marked, _ = replay(ROWS["gan"][0])
    assert marked.count("|o zero:D") == 3 and marked.count("step:G") == 4
    marked, _ = replay(ROWS["wgan critic, 5 per generator step"][0])
    iterations = marked.split("|o")
    assert [part.count("step:C") for part in iterations] == [1, 1, 1, 1, 1, 5, 5, 5]
    assert all(part.count("step:G") == 1 for part in iterations[4:])


def test_a_critic_whose_generator_stopped_no_longer_waits_for_it() -> None:
    critic = "fetch:a zero:C back step:C"
    events = " ".join([CRITIC] * 2 + [critic] * (LAGGING_OPTIMIZER_STEPS + 3))
    marked, _ = replay(events)
    tail = marked.split("step:G")[-1]
    # 128 more critic steps wait for the generator; the next takes the iteration, and each one after is a step
    assert tail.count("|o") == 3
    assert tail.split("|o")[1].count("step:C") == LAGGING_OPTIMIZER_STEPS + 1


def test_an_optimizer_class_that_is_not_wrapped_marks_at_its_second_step() -> None:
    """No step_begins (a step the hooks could not wrap), no loader, no zero_grad: the post-hook marks."""
    _check("fwd:m back raw:O fwd:m back |o raw:O fwd:m back |o raw:O")


def test_a_daemon_thread_stepping_its_own_optimizer_makes_no_boundary() -> None:
    plain, _ = replay(_repeat(PLAIN, "|o " + PLAIN, 3))
    mixed, policy = replay(_repeat(PLAIN, "thread:teacher |o " + PLAIN + " thread:teacher", 3))
    assert mixed.replace(" thread:teacher", "") == plain
    assert policy.other_threads == {"teacher": 6} and policy.boundaries == 3
    alone, policy = replay(" ".join(["thread:teacher"] * 5))
    assert "|" not in alone
    why = why_no_boundary(policy, "train.py", batches=0)
    assert why is not None and "takes its steps in thread 'teacher'" in why


def test_a_validation_loader_inside_the_training_loop_does_not_split_its_steps() -> None:
    train = "fetch:t zero:O fwd:m back step:O"
    _check(f"{train} |o {train} |o fetch:v fetch:v fetch:v {train} |o {train}")


def test_a_stronger_signal_takes_over_and_says_what_it_replaced() -> None:
    # an inference loop marks on model calls; the script then makes an optimizer and trains
    policy = _check("fwd:m |f fwd:m |f fwd:m new:O fwd:m back step:O |o zero:O fwd:m back step:O |o zero:O")
    assert policy.takeovers == [Takeover("forward", "optimizer", 2)] and policy.restart
    assert "recorded again on optimizer.step()" in policy.takeovers[0].note()


def test_skalpel_step_takes_over_from_the_optimizer() -> None:
    policy = BoundaryPolicy()
    for event in [("fetch", "a"), ("step_begins", "O"), ("optimizer_begins",), ("optimizer_step", "O")] * 3:
        policy.on(event)
    assert policy.boundaries == 2 and policy.marking == "optimizer"
    first = policy.on(("user_step",))
    assert first == Boundary("user", takeover=Takeover("optimizer", "user", 2)) and not policy.module_calls_matter
    assert policy.on(("fetch", "a")) is None and policy.on(("user_step",)) == Boundary("user")


def test_an_optimizer_seen_first_turns_the_module_calls_off() -> None:
    policy = BoundaryPolicy()
    assert policy.module_calls_matter
    policy.on(("fetch", "a"))
    assert not policy.module_calls_matter  # a DataLoader outranks them
    assert not BoundaryPolicy("optimizer").module_calls_matter and BoundaryPolicy("forward").module_calls_matter


def test_step_on_picks_the_signal() -> None:
    assert _check(_repeat(PLAIN, "|d " + PLAIN, 2), only="dataloader").signal == "dataloader"
    assert _check(_repeat(PLAIN, "fetch:a zero:O |b fwd:m back step:O", 2), only="backward").signal == "backward"
    with pytest.raises(ValueError, match="unknown step signal"):
        BoundaryPolicy("loss")


def test_a_forked_child_counts_its_boundaries_for_the_parent() -> None:
    policy = _check(_repeat(PLAIN, "|c " + PLAIN, 2), owner=lambda: False)
    assert policy.boundaries == 0 and policy.signal is None and not policy.takeovers


def test_work_held_before_the_first_step_is_said_when_far_longer_than_a_step() -> None:
    _, ppo = replay(ROWS["ppo rollout then minibatch updates"][0])
    note = ppo.held_note()
    assert note is not None and "repeated top-level module calls" in note and "an RL rollout" in note
    assert ppo.held_s is not None and ppo.held_s >= HELD_WORK_STEPS * 0.004
    _, short = replay("new:O fwd:m fwd:m " + " ".join(["fwd:m back step:O zero:O"] * 5))
    assert short.held == 2 and short.held_note() is None  # one evaluation call: less than a step's work


def test_gradscaler_skipped_steps_are_counted_and_said() -> None:
    _, policy = replay(ROWS["gradscaler skips every other step"][0])
    assert (policy.skipped_steps, policy.scaler_steps) == (3, 6)
    assert "3 of 6 optimizer steps were skipped by GradScaler" in (policy.skipped_note() or "")


@pytest.mark.parametrize(
    ("events", "options", "says"),
    [
        ("", {}, "no step boundary found in train.py: skalpel looks for optimizer.step() calls"),
        ("", {"failed": True}, "it ended before its first iteration"),
        ("new:O fwd:m fwd:m fwd:m", {}, "never stepped: skalpel took its top-level module calls for evaluation"),
        ("fetch:a", {}, "zero steps ran in train.py: its DataLoader yielded no batch"),
        ("fetch:a", {"batches": 1}, "it showed DataLoader batches but no second iteration"),
        ("fetch:a", {"children": "training ran in 2 child process(es)"}, "no step in the main process of train.py"),
    ],
)
def test_why_no_boundary_is_one_text(events: str, options: dict, says: str) -> None:
    _, policy = replay(events)
    why = why_no_boundary(policy, "train.py", **{"batches": 0, **options})
    assert why is not None and says in why
    _, stepped = replay(_repeat(PLAIN, PLAIN, 1))
    assert why_no_boundary(stepped, "train.py", batches=2) is None


def test_why_no_boundary_with_step_on_optimizer_and_no_optimizer() -> None:
    _, policy = replay("fetch:a fetch:a", only="optimizer")
    why = why_no_boundary(policy, "train.py", batches=2)
    assert why is not None and "no optimizer.step() call in train.py (--step-on optimizer)" in why


def test_the_policy_imports_no_torch() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import skalpel.capture.boundaries, sys; assert 'torch' not in sys.modules"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
