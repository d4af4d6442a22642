"""The receiving end of the actor -> learner path in front of a bounded queue, shared by the thread and
process runners: an arrival is classified and recorded, and enters the queue (or is refused by it, by
policy) under the ledger's lock; a refusal at the door (the run is stopping, the sender was abandoned) is
booked there; under ``block`` the caller waits for room outside the lock and tries again."""
from __future__ import annotations

from typing import Callable

from ..accounting import DUPLICATE, FIRST, TOO_OLD, Ledger
from ..fragment import Fragment
from ..transport import FragmentQueue
from .worker import ABANDONED, CLOSED, OK


def arrive_at_queue(ledger: Ledger, queue: FragmentQueue, frag: Fragment, abandoned: Callable[[], bool],
                    taken: Callable[[], None], wait: Callable[[float], None], poll_s: float) -> str:
    """Deliver one arrival; ``taken()`` runs under the ledger's lock in the same hold that records it (the
    sender's side of the move). Returns OK, CLOSED or ABANDONED."""
    while True:
        with ledger.lock:
            cls = ledger.classify(frag)
            refusal = CLOSED if queue.closed else ABANDONED if abandoned() else None
            if refusal is not None or cls == TOO_OLD:
                ledger.arrive(frag, cls)
                if cls == FIRST:
                    ledger.book("dropped", "shutdown" if refusal == CLOSED else "abandoned", frag.length)
                taken()
                return refusal or OK
            if queue.try_put(frag, {FIRST: True, DUPLICATE: False}.get(cls)):
                ledger.arrive(frag, cls)
                taken()
                return OK
        queue.wait_room(frag.nbytes, poll_s)  # block: the queue is full
        wait(poll_s)
