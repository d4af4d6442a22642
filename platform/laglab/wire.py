"""The fixed-layout messages an actor process sends the learner over its pipe (``Connection.send_bytes``):
little-endian int64 fields, no pickles. Bulk data is in shared-memory slots (:mod:`laglab.shm`); a FRAG
message only says which slot holds which fragment. Every message also carries the sender's books at the
moment it was sent — steps produced so far, in hand (collected, not yet handed to the link) and on its link
(handed over, header not yet sent) — so the learner reads a consistent picture of each actor in pipe order.

An actor sends what one rollout produced as one BUNDLE (its messages in order, each prefixed by its length):
one pipe write and one wake-up of the learner's receiver per rollout instead of one per fragment, which keeps
the receiver thread from taking the GIL from the learner's update thousands of times a second.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np

from .fragment import FragmentId

PRODUCED, SENT, FRAG, ERROR, DONE, STARTED, BUNDLE, DISCARDED = 1, 2, 3, 4, 5, 6, 7, 8
_LEN = struct.Struct("<I")
_HEAD = struct.Struct("<qqqqq")  # kind, incarnation, produced, in_hand, link
_SENT = struct.Struct("<qqq")  # env_index, t_end, steps
_DISCARD = struct.Struct("<qq")  # steps, t_end
_FRAG = struct.Struct("<qqqqqqqqqqq")  # slot, actor, incarnation, env, episode, episode_t0, t_start, t_end, version,
#                                        schema, k
_EPISODE = np.dtype([("env_index", "<i8"), ("ret", "<f8"), ("length", "<i8")])


@dataclass
class Message:
    kind: int
    incarnation: int
    books: Tuple[int, int, int]  # produced, in_hand, link
    slot: int = -1
    fid: Optional[FragmentId] = None
    k: int = 0
    sent: Optional[Tuple[int, int, int]] = None  # env_index, t_end, steps
    episodes: Optional[np.ndarray] = None
    text: str = ""
    discarded: int = 0  # DISCARDED: steps produced and thrown away (a stale snapshot, actor.refresh_lag) ...
    skip_to: int = -1  # ... and the t_end every env's stream skips to


def _head(kind: int, inc: int, books: Tuple[int, int, int]) -> bytes:
    return _HEAD.pack(kind, inc, *books)


def produced(inc: int, books, episodes: List[Tuple[int, float, int]]) -> bytes:
    arr = np.array(episodes, dtype=_EPISODE) if episodes else np.zeros(0, _EPISODE)
    return _head(PRODUCED, inc, books) + arr.tobytes()


def discarded(inc: int, books, steps: int, t_end: int, episodes: List[Tuple[int, float, int]]) -> bytes:
    """A rollout stopped and thrown away (its snapshot went stale): ``books`` count its steps as produced, not in
    hand; the learner books them as dropped for ``refresh`` when it takes these books, and skips every env's
    stream to ``t_end`` (the process runner's envs step in lockstep)."""
    arr = np.array(episodes, dtype=_EPISODE) if episodes else np.zeros(0, _EPISODE)
    return _head(DISCARDED, inc, books) + _DISCARD.pack(steps, t_end) + arr.tobytes()


def sent(inc: int, books, env_index: int, t_end: int, steps: int) -> bytes:
    return _head(SENT, inc, books) + _SENT.pack(env_index, t_end, steps)


def frag(inc: int, books, slot: int, fid: FragmentId, k: int) -> bytes:
    return _head(FRAG, inc, books) + _FRAG.pack(slot, fid.actor_id, fid.incarnation, fid.env_index, fid.episode_id,
                                                fid.episode_t0, fid.t_start, fid.t_end, fid.behavior_version,
                                                fid.schema_version, k)


def error(inc: int, books, text: str) -> bytes:
    return _head(ERROR, inc, books) + text.encode("utf-8", "replace")[:65536]


def done(inc: int, books) -> bytes:
    return _head(DONE, inc, books)


def started(inc: int) -> bytes:
    return _head(STARTED, inc, (0, 0, 0))


def bundle(messages: List[bytes]) -> bytes:
    """Several messages as one (in order); a single message goes as itself."""
    if len(messages) == 1:
        return messages[0]
    return _head(BUNDLE, 0, (0, 0, 0)) + b"".join(_LEN.pack(len(m)) + m for m in messages)


def split(data: bytes) -> List[bytes]:
    """The messages in what arrived: a bundle's parts in order, or the message itself. Raises ValueError on a
    malformed bundle (a nested bundle included)."""
    if len(data) < _HEAD.size or _HEAD.unpack_from(data, 0)[0] != BUNDLE:
        return [data]
    out, i = [], _HEAD.size
    while i < len(data):
        if i + _LEN.size > len(data):
            raise ValueError("truncated bundle")
        (n,) = _LEN.unpack_from(data, i)
        i += _LEN.size
        if i + n > len(data):
            raise ValueError("truncated bundle")
        part = data[i:i + n]
        if len(part) >= _HEAD.size and _HEAD.unpack_from(part, 0)[0] == BUNDLE:
            raise ValueError("nested bundle")
        out.append(part)
        i += n
    return out


def parse(data: bytes) -> Message:
    """Raises ValueError on anything that is not a well-formed message."""
    if len(data) < _HEAD.size:
        raise ValueError(f"message of {len(data)} bytes")
    kind, inc, p, h, l = _HEAD.unpack_from(data, 0)
    m = Message(kind, inc, (p, h, l))
    body = data[_HEAD.size:]
    if kind == FRAG:
        if len(body) != _FRAG.size:
            raise ValueError("FRAG body size")
        slot, a, i, e, ep, ept, t0, t1, v, sv, k = _FRAG.unpack(body)
        m.slot, m.k = slot, k
        m.fid = FragmentId(actor_id=a, incarnation=i, env_index=e, episode_id=ep, episode_t0=ept, t_start=t0,
                           t_end=t1, behavior_version=v, schema_version=sv)
    elif kind == SENT:
        if len(body) != _SENT.size:
            raise ValueError("SENT body size")
        m.sent = _SENT.unpack(body)
    elif kind == PRODUCED:
        if len(body) % _EPISODE.itemsize:
            raise ValueError("PRODUCED body size")
        m.episodes = np.frombuffer(body, dtype=_EPISODE)
    elif kind == DISCARDED:
        if len(body) < _DISCARD.size or (len(body) - _DISCARD.size) % _EPISODE.itemsize:
            raise ValueError("DISCARDED body size")
        m.discarded, m.skip_to = _DISCARD.unpack_from(body, 0)
        if m.discarded < 0:
            raise ValueError("DISCARDED steps < 0")
        m.episodes = np.frombuffer(body[_DISCARD.size:], dtype=_EPISODE)
    elif kind == ERROR:
        m.text = body.decode("utf-8", "replace")
    elif kind not in (DONE, STARTED):
        raise ValueError(f"unknown message kind {kind}")
    return m
