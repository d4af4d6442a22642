"""laglab entry point: ``python train.py [overrides]`` (Hydra). See README.md for the config groups."""
from __future__ import annotations

import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "platform"))

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from hydra.types import RunMode  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from laglab.config import ConfigError, register_configs, validate  # noqa: E402

register_configs()


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    from laglab.run import check_resume, env_spec, run

    try:
        c = validate(cfg)
        spec = env_spec(c)  # an env id that cannot be made is a config error too, reported before anything starts
        check_resume(c, spec)
    except ConfigError as e:
        print(f"laglab: {e}", file=sys.stderr)
        sys.exit(2)

    signal.signal(signal.SIGTERM, _interrupt)  # a killed run still writes its summary (status: interrupted)
    hc = HydraConfig.get()
    group = hc.sweep.dir if hc.mode == RunMode.MULTIRUN else None  # a sweep is one W&B group
    resolved = OmegaConf.to_container(cfg, resolve=True)
    summary = run(c, hc.runtime.output_dir, resolved_config=resolved, group=group)
    return float(summary["final_return_mean"])


if __name__ == "__main__":
    main()
