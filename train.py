"""laglab entry point: ``python train.py [overrides]`` (Hydra). See README.md for the config groups."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "platform"))

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from laglab.config import ConfigError, register_configs, validate  # noqa: E402

register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    from laglab.run import env_spec, run

    try:
        c = validate(cfg)
        env_spec(c)  # an env id that cannot be made is a config error too, reported before any thread starts
    except ConfigError as e:
        print(f"laglab: {e}", file=sys.stderr)
        sys.exit(2)

    summary = run(c, HydraConfig.get().runtime.output_dir)
    return float(summary["final_return_mean"])


if __name__ == "__main__":
    main()
