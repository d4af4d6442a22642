"""laglab entry point: ``python train.py [overrides]`` (Hydra). See README.md for the config groups.

Exit codes: 0 the run (every job of a sweep) completed; 2 a bad override or config, refused before anything
started (no run dir); 130 stopped by Ctrl-C, SIGTERM or SIGHUP (the summary says "interrupted"; a sweep stops too);
1 the run failed.

Kept light at import: actor processes started with ``spawn`` re-import this module, and must not pay for
Hydra (everything heavy is imported when it runs as the program)."""
from __future__ import annotations

import time

T_TOP = time.monotonic()  # (the interpreter's start-up ends here: laglab.timeline's "interpreter")

import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "platform"))
# numpy's BLAS on one thread in the learner's process (before numpy loads; a value the user set is kept): laglab's
# numpy work there is small matrices per env step (the sync and thread runners' inference, a recurrent cell), which
# a second BLAS thread only slows (an LSTM policy's sync run: 2.6x slower with two). torch's threads are
# runner.torch_threads, not this.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

INTERRUPTED = 130  # the shell's code for a process ended by SIGINT


def main(cfg) -> float:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from laglab import timeline

    hc = HydraConfig.get()
    sweep = hc.mode == RunMode.MULTIRUN
    if sweep and timeline.get("config") is not None:  # a later job of a sweep: its start-up counts from here
        timeline.reset()
        timeline.mark("process_start")
    else:
        timeline.mark("interpreter", T_TOP)
    timeline.mark("config")
    from laglab.config import ConfigError, validate
    from laglab.runners import warm_up
    from laglab.runners.supervisor import request_stop, stop_requested

    try:
        c = validate(cfg)  # checked before Hydra started (laglab.preflight); run() checks again before it starts
    except ConfigError as e:
        print(f"laglab: {e}", file=sys.stderr)
        sys.exit(2)
    warm_up(c.runner)  # (the actors' fork server imports while this process imports torch)
    from laglab.run import CheckpointFailed, run

    timeline.mark("imports")
    if stop_requested():  # Ctrl-C between two jobs of a sweep: start no other
        sys.exit(INTERRUPTED)
    # SIGTERM, Ctrl-C and SIGHUP (the terminal or ssh session closed) stop the run at its next safe point; it
    # still writes its summary (status: interrupted). A SIGHUP ignored by whoever started us (nohup) stays ignored.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        if not (sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN):
            signal.signal(sig, request_stop)
    group = hc.sweep.dir if sweep else None  # a sweep is one W&B group
    try:
        resolved = OmegaConf.to_container(cfg, resolve=True)
        resolved["actors"] = c.actors  # (actors=auto resolved: W&B's config shows the count the run used)
        summary = run(c, hc.runtime.output_dir, resolved_config=resolved, group=group)
    except ConfigError as e:
        print(f"laglab: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:  # the run wrote its summary and logged its last line
        sys.exit(INTERRUPTED)
    except CheckpointFailed as e:
        print(f"laglab: training completed, but {e}", file=sys.stderr)
        sys.exit(1)
    if sweep and stop_requested():  # the signal came as the job was finishing: the sweep stops here
        sys.exit(INTERRUPTED)
    return float(summary["final_return_mean"])


if __name__ == "__main__":
    try:
        import hydra

        from laglab.config import ConfigError, register_configs
        from laglab.preflight import VERSION_BASE, hand_over, preflight

        register_configs()
        try:
            sys.argv = preflight(sys.argv, os.path.abspath(__file__))
        except ConfigError as e:
            print(f"laglab: {e}", file=sys.stderr)
            sys.exit(2)
        with hand_over():  # (a single run: Hydra runs the composition preflight checked, not composing it twice more)
            hydra.main(version_base=VERSION_BASE, config_path="conf", config_name="config")(main)()
    except KeyboardInterrupt:  # Ctrl-C before a run installed its handler (imports, composition)
        print("laglab: interrupted before a run started", file=sys.stderr)
        sys.exit(INTERRUPTED)
