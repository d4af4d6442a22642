"""Preloaded by the process runner's fork server (``set_forkserver_preload``), and by nothing else: importing it
asks the kernel to SIGKILL *this process* when its parent dies. In the fork server that parent is the learner, so
the server, and through their own parent-death signal every actor it forked, go when the learner goes."""
from ..lifetime import die_with_parent

die_with_parent()
