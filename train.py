"""laglab entry point: ``python train.py [overrides]`` (Hydra). See README.md for the config groups.

Kept light at import: actor processes started with ``spawn`` re-import this module, and must not pay for
Hydra (everything heavy is imported when it runs as the program)."""
from __future__ import annotations

import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "platform"))


def main(cfg) -> float:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from laglab.config import ConfigError, validate
    from laglab.run import check_resume, env_spec, run
    from laglab.runners.supervisor import request_stop

    try:
        c = validate(cfg)
        spec = env_spec(c)  # an env id that cannot be made is a config error too, reported before anything starts
        check_resume(c, spec)
        if c.runner.name.value == "process":
            from laglab.runners.process import check_fits

            check_fits(c, spec)
    except ConfigError as e:
        print(f"laglab: {e}", file=sys.stderr)
        sys.exit(2)

    # SIGTERM and Ctrl-C stop the run at its next safe point; it still writes its summary (status: interrupted)
    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    hc = HydraConfig.get()
    group = hc.sweep.dir if hc.mode == RunMode.MULTIRUN else None  # a sweep is one W&B group
    resolved = OmegaConf.to_container(cfg, resolve=True)
    summary = run(c, hc.runtime.output_dir, resolved_config=resolved, group=group)
    return float(summary["final_return_mean"])


if __name__ == "__main__":
    import hydra

    from laglab.config import register_configs

    register_configs()
    hydra.main(version_base="1.3", config_path="conf", config_name="config")(main)()
