"""Input sets for the timed calls: what was timed is what was checked.

A timed loop that calls a kernel on one set of tensors, again and again, lets a kernel serve a
result it made before (a cache keyed by pointer or by content), skip work whose output is already
in its buffer, or do part of the work; a check of one call made after the loop sees none of it. So:

- **Rotation.** Timed calls alternate over two input sets with different values in different
  storage: the checked inputs (set A) and their negation (set B: -q, -k, -v and -dO). Scores are
  unchanged (q·k = (-q)·(-k) exactly), so every output of set B is exactly the negation of set A's
  (O = P·V, and the backward's dQ, dK, dV each carry one negated factor; the log-sum-exp is the
  same), bit for bit for a deterministic kernel: set B's calls are checked without another
  reference. Consecutive calls never see the same values, and the output buffer they share holds
  the other set's answer when a call skips its work.
- **Checked timed calls.** A few timed calls, chosen at random (the kernel cannot know which), have
  their outputs copied right after the call, outside the timed interval (faprof.timing.harness);
  each copy is compared with its set's expected outputs (`expected`), bitwise or, for a kernel that
  is not deterministic, against the reference under the row's tolerance.
- **New inputs.** `fresh` makes a call on inputs no call has seen (new random values, new storage):
  the drained calls (faprof.timing.integrity) run on those, so a timed median on inputs seen before
  that is faster than calls on new inputs is caught, whatever the cache is keyed on.

Where a second set does not fit the GPU's memory, the timed calls use set A alone (`sets` is 1 and
the row's `input_sets` says so).
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Callable
from typing import Any

from faprof.correctness import check as correctness
from faprof.model.problem import AttentionProblem

#: Output names whose set-B value is the negation of set A's (every output but the log-sum-exp).
NEGATED = ("out", "dq", "dk", "dv")

#: Timed calls whose outputs are copied and checked: in the first batch (both input sets), ...
CHECKS_FIRST = 2

#: ... and one in each of the next batches up to this many checked calls in all.
CHECKS_MAX = 4


def _negated(t: Any) -> Any:
    import torch

    with torch.no_grad():
        n = t.detach().neg()
    return n.requires_grad_(t.requires_grad)


class Rotation:
    """The timed call as a callable that alternates over the input sets (`last`: the set of the last
    call, 0 for A, 1 for B); `fresh()` gives a call on never-seen inputs."""

    def __init__(self, variant: Any, problem: AttentionProblem, ts: list[Any], dout: Any, out: Any,
                 args: Any, two: bool = True) -> None:
        self.variant, self.problem, self.out, self.args = variant, problem, out, args
        self.calls: list[Callable[[], Any]] = [correctness.make_call(variant, problem, ts, dout, out, args)[1]]
        self.note = ""
        self._keep: Any = None
        self._dout = dout
        self._ts = ts
        if two:
            try:
                tb, db = [_negated(t) for t in ts], _negated(dout) if dout is not None else None
                self.calls.append(correctness.make_call(variant, problem, tb, db, out, args)[1])
                self._b = (tb, db)
            except Exception as e:  # out of memory for a second set (or a variant that refuses it)
                if not _is_oom(e):
                    raise
                self.note = "one input set (no GPU memory for a second)"
        self.n = 0
        self.last = 0

    @property
    def sets(self) -> int:
        return len(self.calls)

    def __call__(self) -> Any:
        i = self.n % len(self.calls)
        self.n += 1
        self.last = i
        return self.calls[i]()

    def fresh(self) -> Callable[[], Any]:
        """A call on new inputs: new storage, new random values (q, k, v and dO; index tensors as they
        are). The inputs live until the next `fresh`, so no two fresh calls share storage."""
        import torch

        gen = torch.Generator(device=self._ts[0].device).manual_seed(int.from_bytes(os.urandom(6), "little"))
        for attempt in (0, 1):
            try:
                with torch.no_grad():
                    ts = [torch.empty_like(t).normal_(generator=gen).requires_grad_(t.requires_grad) for t in self._ts]
                    dout = torch.empty_like(self._dout).normal_(generator=gen) if self._dout is not None else None
                call = correctness.make_call(self.variant, self.problem, ts, dout, self.out, self.args)[1]
            except Exception as e:
                if not _is_oom(e):
                    raise
                if attempt == 0:  # the previous fresh set's memory first, then once more
                    self._keep = None
                    continue
                if "no GPU memory for new inputs" not in self.note:
                    self.note = "; ".join(x for x in (self.note, "drained calls on the checked inputs (no GPU memory "
                                                      "for new inputs)") if x)
                return self.calls[0]
            self._keep = (ts, dout)  # the previous fresh set is freed only now
            return call
        return self.calls[0]

    def release(self) -> None:
        """Free set B and the last fresh inputs (after timing: the later checks use set A only)."""
        self.calls = self.calls[:1]
        self._keep = None
        self.__dict__.pop("_b", None)


def chosen(n: int, batch: int, checked: int, sets: int) -> set[int]:
    """Which calls of the next timed batch (`n` calls; `batch` batches before it, `checked` calls checked
    so far) have their outputs checked: CHECKS_FIRST in the first batch, one of each input set where there
    are two (consecutive calls alternate sets), then one per batch up to CHECKS_MAX; at random."""
    room = CHECKS_MAX - checked
    if room <= 0 or n <= 0:
        return set()
    if batch == 0:
        k = min(CHECKS_FIRST, room, n)
        if sets > 1 and n >= 2 and k >= 2:  # an even call and an odd one: both sets, whichever comes first
            return {2 * random.randrange((n + 1) // 2), 2 * random.randrange(n // 2) + 1}
        return set(random.sample(range(n), k))
    return {random.randrange(n)}


def _is_oom(e: BaseException) -> bool:
    return type(e).__name__ == "OutOfMemoryError" or "out of memory" in str(e).lower()


def expected(problem: AttentionProblem, checked: list[Any], which: int) -> list[Any]:
    """Set `which`'s expected outputs from the checked call's (set A's) outputs."""
    if which == 0:
        return checked
    names = correctness._outputs(problem, tuple(checked) if len(checked) > 1 else checked[0])[0]
    return [c.neg() if n in NEGATED else c for n, c in zip(names, checked, strict=False)]


def expected_ref(ref: Any, which: int) -> Any:
    """The reference of set `which` (set B: outputs and gradients negated, the LSE the same)."""
    if which == 0 or ref is None:
        return ref
    grads = tuple(g.neg() for g in ref.grads) if ref.grads is not None else None
    return dataclasses.replace(ref, out=ref.out.neg(), grads=grads)


def set_name(which: int) -> str:
    return "A (the checked inputs)" if which == 0 else "B (the checked inputs negated)"
