"""Preloaded by the process runner's fork server (``set_forkserver_preload``), and by nothing else: importing it
asks the kernel to SIGKILL *this process* when its parent dies. In the fork server that parent is the learner, so
the server, and through their own parent-death signal every actor it forked, go when the learner goes. It also
blocks the stop signals (Ctrl-C, SIGTERM, SIGHUP), so an actor it forks cannot be interrupted before it handles them
itself."""
import signal

from ..lifetime import STOP_SIGNALS, die_with_parent

die_with_parent()
# the actors it forks start with the stop signals blocked (the mask survives fork), until they handle them
signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
