"""A program run on a pseudo-terminal, as a person runs it: the one helper the terminal tests share."""
import os
import pty
import select
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _controlling_tty():
    os.setsid()
    import fcntl
    import termios
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as a login shell starts it (also when the tests run under nohup)


def run_in_terminal(argv, on_output=None, controlling=False, timeout=300, hang_up_when=None):
    """Run ``python argv...`` from the repo root with stdin, stdout and stderr on a pseudo-terminal (its
    controlling terminal with ``controlling``, so ^C is a SIGINT to its foreground group, actor processes
    included). ``on_output(screen, proc, type_keys)`` is called with the screen so far after each read
    (``type_keys(b"...")`` types into the terminal). ``hang_up_when(screen, proc)``: once it is true, the terminal
    closes (as a closed window or a dropped ssh session: the kernel hangs up the program's session). Returns
    (exit code, everything the terminal received)."""
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, *map(str, argv)], cwd=ROOT, stdin=slave, stdout=slave, stderr=slave,
                         env=dict(os.environ, TERM="xterm", COLUMNS="120"),
                         preexec_fn=_controlling_tty if controlling else None)
    os.close(slave)
    screen = b""
    try:
        while True:
            if hang_up_when and hang_up_when(screen.decode("utf-8", "replace"), p):
                os.close(master)
                master = None
                return p.wait(timeout), screen.decode("utf-8", "replace")
            r, _, _ = select.select([master], [], [], 1.0)
            if r:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                screen += chunk
                if on_output:
                    on_output(screen.decode("utf-8", "replace"), p, lambda keys: os.write(master, keys))
            elif p.poll() is not None:
                break
        rc = p.wait(timeout)
    finally:
        if p.poll() is None:
            p.kill()
        if master is not None:
            os.close(master)
    return rc, screen.decode("utf-8", "replace")
