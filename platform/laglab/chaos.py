"""Fault injection on the actor -> learner path, reproducible from the seed and counted event by event, so
tests can check that what was injected is exactly what was detected.

A :class:`ChaosChannel` sits between one actor incarnation and the transport. Per fragment it may drop it
(lost in transit), corrupt it (NaN observations, a wrong observation shape, an impossible probability, an
unknown schema version), hold it back until after the next delivery (reorder) or the next
``delay_fragments`` deliveries (delay), and deliver it twice (duplicate). Actor kills, actor hangs and
learner stalls are scheduled by step/update counts and carried out by the runners.
"""
from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from .config import ChaosConfig
from .fragment import Fragment

CORRUPTIONS = ("nan", "shape", "prob", "schema")  # what any fragment can suffer
MASKED_CORRUPTIONS = CORRUPTIONS + ("mask",)  # ... and a masked env's: its action's mask entry cleared
COUNTED = MASKED_CORRUPTIONS + ("state",)  # every kind a count is kept for (state: a recurrent policy's, not finite)
# the admission reason each corruption must be refused with
EXPECTED_REASON = {"nan": "non_finite", "shape": "shape", "prob": "logp", "schema": "schema", "mask": "mask",
                   "state": "state"}


def kinds_for(masked: bool, base: Tuple[str, ...] = CORRUPTIONS, recurrent: bool = False) -> Tuple[str, ...]:
    """The corruptions a link of this env (and policy) can carry (``base``: what the link's form allows)."""
    return base + (("mask",) if masked else ()) + (("state",) if recurrent else ())


class ActorKilled(RuntimeError):
    """A scripted actor crash."""


@dataclass
class ChaosCounts:
    duplicated: int = 0  # extra deliveries (fragments)
    reordered: int = 0
    delayed: int = 0
    dropped_steps: int = 0  # transitions lost in transit
    corrupted: Dict[str, int] = field(default_factory=collections.Counter)  # fragments by kind
    corrupted_steps: Dict[str, int] = field(default_factory=collections.Counter)  # transitions by kind
    kills: int = 0
    hangs: int = 0
    stalls: int = 0
    lost_held_steps: int = 0  # held on the link of an actor process when it was killed (died with it)

    def merge(self, other: "ChaosCounts") -> None:
        for f in dataclasses.fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if isinstance(a, dict):
                a.update(b)
            else:
                setattr(self, f.name, a + b)

    def as_dict(self) -> Dict[str, object]:
        d = dataclasses.asdict(self)
        d["corrupted"] = dict(self.corrupted)
        d["corrupted_steps"] = dict(self.corrupted_steps)
        return d


def corrupt(frag: Fragment, kind: str) -> Fragment:
    """A damaged copy of ``frag`` (the original is immutable and untouched)."""
    if kind == "nan":
        obs = frag.obs.copy()
        obs[len(obs) // 2].flat[0] = np.nan
        return dataclasses.replace(frag, obs=obs)
    if kind == "shape":
        return dataclasses.replace(frag, obs=np.concatenate([frag.obs, frag.obs[:, :1]], axis=1))
    if kind == "prob":
        logp = frag.logp.copy()
        logp[0] = 0.5  # log-probability > 0: a probability above 1 (for continuous actions: not finite)
        if frag.mean is not None:
            logp[0] = np.inf
        return dataclasses.replace(frag, logp=logp)
    if kind == "schema":
        return dataclasses.replace(frag, id=dataclasses.replace(frag.id, schema_version=frag.id.schema_version + 100))
    if kind == "mask" and frag.masks is not None:
        masks = frag.masks.copy()
        t = len(masks) // 2
        masks[t, int(frag.actions[t])] = False  # the action taken is now one its mask forbids
        if not masks[t].any():
            masks[t, (int(frag.actions[t]) + 1) % masks.shape[1]] = True
        return dataclasses.replace(frag, masks=masks)
    if kind == "state" and frag.state is not None:
        state = frag.state.copy()
        state.flat[state.size // 2] = np.nan  # the recurrent state the fragment starts from is not finite
        return dataclasses.replace(frag, state=state)
    raise ValueError(f"unknown corruption {kind!r} (of this fragment); allowed: {', '.join(COUNTED)}")


class ChaosChannel:
    """The link between one actor incarnation and the transport, with what can go wrong on it.

    :meth:`send` puts a fragment on the link; what comes out the other end, in order, is in ``outbox``
    (possibly nothing, possibly older fragments released now, possibly two copies). Held-back fragments
    wait in ``held`` until enough later deliveries have passed them. Without faults configured, the link
    is a plain FIFO."""

    def __init__(self, cfg: ChaosConfig, seed: int, actor_id: int, incarnation: int,
                 kinds: Tuple[str, ...] = CORRUPTIONS):
        """``kinds``: the corruptions this link can carry (fixed-layout shared-memory slots cannot hold an
        array of the wrong shape, so the process runner leaves "shape" out)."""
        self.cfg = cfg
        self.kinds = kinds
        self.rng = np.random.default_rng([seed, actor_id, incarnation, 0xC4A05])
        self.counts = ChaosCounts()
        self.held: List[Tuple[Fragment, int]] = []  # (fragment, deliveries still to wait)
        self.outbox: List[Fragment] = []  # leaving the link, in order
        self.kill_at: Optional[int] = cfg.kill_every_steps
        self.hang_at: Optional[int] = cfg.hang_every_steps
        c = cfg
        self.active = any(p > 0 for p in (c.duplicate_p, c.reorder_p, c.delay_p, c.drop_p, c.corrupt_p))

    def send(self, frag: Fragment) -> None:
        if not self.active:
            self.outbox.append(frag)
            return
        c, r = self.cfg, self.rng
        ready = [f for f, n in self.held if n <= 1]
        self.held = [(f, n - 1) for f, n in self.held if n > 1]
        if r.random() < c.drop_p:
            self.counts.dropped_steps += frag.length
        else:
            if r.random() < c.corrupt_p:
                kind = self.kinds[int(r.integers(len(self.kinds)))]
                frag = corrupt(frag, kind)
                self.counts.corrupted[kind] += 1
                self.counts.corrupted_steps[kind] += frag.length
            u = r.random()
            if u < c.delay_p:
                self.held.append((frag, c.delay_fragments))
                self.counts.delayed += 1
            elif u < c.delay_p + c.reorder_p:
                self.held.append((frag, 1))
                self.counts.reordered += 1
            else:
                self.outbox.append(frag)
                if r.random() < c.duplicate_p:
                    self.outbox.append(frag)  # a retried delivery: the same immutable fragment
                    self.counts.duplicated += 1
        self.outbox.extend(ready)

    def flush(self) -> None:
        """Release everything held back (before an actor pauses, and when an incarnation ends)."""
        self.outbox.extend(f for f, _ in self.held)
        self.held = []

    def contents(self) -> List[Fragment]:
        """Every fragment still on the link (held or about to come out)."""
        return [f for f, _ in self.held] + self.outbox
