"""The command line's edge. Before Hydra makes a run dir, every job of ``python train.py [-m] [overrides]`` is
composed as Hydra will compose it and checked as the run will check it (:func:`laglab.checks.prestart`), and
Hydra's own errors -- an override it cannot parse, a key or value it cannot merge, an option a group lacks --
are said the laglab way: one line naming the key, what is allowed, a "did you mean" for a near miss. A command
that fails here leaves nothing behind (no run dir, no sweep dir) and exits with code 2, as laglab's own
config errors do.

A sweep job's dir (``multirun/.../0_algo=ppo,seed=0``) is a valid ``resume=`` value as written: an ``=``
cannot be part of an unquoted Hydra value, so :func:`quote_resume` quotes it."""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import json
import os
import re
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

from .config import (Config, ConfigError, describe_type, did_you_mean, key_type, schema_keys, unknown_key_message,
                     validate)

VERSION_BASE = "1.3"  # train.py's @hydra.main(version_base=...): preflight composes under the same rules
INFO_FLAGS = ("help", "hydra_help", "cfg", "info", "shell_completion")  # Hydra prints and exits: nothing to check
_RESUME = re.compile(r"(\+{0,2}resume)=(.*)", re.S)


def quote_resume(arg: str) -> str:
    """``resume=<dir>`` quoted for Hydra's grammar when the dir's name needs it (a sweep job's dir has ``=``
    and ``,`` in it); any other argument as it is. A value with ``,`` that is no existing path stays a sweep."""
    m = _RESUME.fullmatch(arg)
    if not m:
        return arg
    key, value = m.groups()
    if not value or value[0] in "'\"[" or "\\" in value:
        return arg
    if "=" in value or (re.search(r"[,\s()\[\]{}]", value) and Path(value).exists()):
        q = "'" if "'" not in value else '"'
        return arg if q in value else f"{key}={q}{value}{q}"
    return arg


def _refused(overrides: Sequence[str], key: str, refused: object) -> Optional[str]:
    """The value of ``key`` as the command line wrote it that was refused (``refused``: the value the error names):
    where the key is written more than once (``total_env_steps=1e5 total_env_steps=20000``), the one refused, not
    simply the last; the last where none matches."""
    written = [v for o in overrides for k, eq, v in [o.lstrip("+~").partition("=")] if eq and k == key]
    if refused is not None:
        for v in reversed(written):
            try:
                if v == str(refused) or float(v) == float(refused):  # (1e5 written, 100000.0 refused)
                    return v
            except (TypeError, ValueError):
                pass
    return written[-1] if written else None


def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip() and not ln.strip().startswith("See https://")]
    return " ".join(lines)


def explain(e: BaseException, overrides: Sequence[str]) -> str:
    """Hydra's composition error ``e`` as one laglab line (without the ``laglab:`` prefix)."""
    from hydra.errors import MissingConfigException, OverrideParseException

    if isinstance(e, OverrideParseException):
        return (f"invalid override {e.override}: {_one_line(e.message)}; allowed: key=value (quote a value that "
                f"has , = [ ] or spaces in it: key='...')")
    if isinstance(e, MissingConfigException):
        if e.options is not None and e.missing_cfg_file and "/" in e.missing_cfg_file:
            group, _, name = e.missing_cfg_file.rpartition("/")
            close = difflib.get_close_matches(name, list(e.options), n=1, cutoff=0.6)
            return (f"invalid config: {group}={name}; allowed: {' | '.join(e.options)}"
                    + (f"; did you mean {group}={close[0]}?" if close else ""))
        return f"invalid command line: {_one_line(str(e).split('Config search path')[0])}"
    msg = str(e)
    if msg.startswith("Ambiguous value for argument"):
        arg = msg.split("'")[1] if "'" in msg else "?"
        key, _, value = arg.partition("=")
        return (f"invalid override {arg}: a list of values is a sweep; allowed: -m (--multirun) to run one job "
                f"per value, {key}=[{value}] for a list, {key}='{value}' for a string")
    cause = e.__cause__
    full_key = getattr(cause, "full_key", None)
    owner = getattr(cause, "object_type", None)
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and full_key:
        if not full_key.startswith("hydra."):
            schema = owner if dataclasses.is_dataclass(owner) else Config
            return unknown_key_message(full_key, schema)
        parent = full_key.rpartition(".")[0]
        keys = [f"{parent}.{f.name}" for f in dataclasses.fields(owner)] if dataclasses.is_dataclass(owner) else []
        return unknown_key_message(full_key, owner, keys)
    if isinstance(cause, ValidationError) and full_key:
        t = key_type(owner, getattr(cause, "key", full_key.rpartition(".")[2])) if owner else None
        value = _refused(overrides, full_key, getattr(cause, "value", None))
        allowed = describe_type(t) if t is not None else _one_line(cause.msg.split("full_key:")[0])
        hint = ""
        if t is int and value is not None:
            try:
                x = float(value)
                hint = f"; did you mean {full_key}={int(x)}?" if x.is_integer() else ""
            except ValueError:
                pass
        elif isinstance(t, type) and issubclass(t, str) and hasattr(t, "__members__") and value is not None:
            close = difflib.get_close_matches(value, [m.value for m in t], n=1, cutoff=0.6)
            hint = f"; did you mean {full_key}={close[0]}?" if close else ""
        return f"invalid config: {full_key}={value if value is not None else '?'}; allowed: {allowed}{hint}"
    return f"invalid command line: {_one_line(msg)}"


def compose(overrides: Sequence[str]) -> Config:
    """The validated config ``python train.py <overrides>`` runs with (the repo's conf/, composed by Hydra as train.py
    composes it, checked by :func:`laglab.config.validate`), for tools that build a run's parts without running it
    (the simulator, benchmarks). A bad override is a :class:`ConfigError` said the way train.py says it."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from .config import register_configs

    conf = Path(__file__).resolve().parents[2] / "conf"
    if not conf.is_dir():
        raise ConfigError(f"no config dir at {conf} (composed from the repo's conf/, as train.py composes it)")
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(conf), version_base=VERSION_BASE):
            cfg = hydra_compose("config", overrides=list(overrides))
    except Exception as e:  # noqa: BLE001 - Hydra's errors, told as train.py tells them
        raise ConfigError(explain(e, list(overrides))) from None
    finally:
        GlobalHydra.instance().clear()
    return validate(cfg)


def task_config(cfg: DictConfig) -> DictConfig:
    """The config a job's function receives (Hydra's own node removed, as Hydra's run_job does)."""
    cfg = copy.deepcopy(cfg)
    with read_write(cfg), open_dict(cfg):
        del cfg["hydra"]
    return cfg


class Jobs:
    """Hydra, set up as ``train.py``'s ``@hydra.main`` sets it up, composing the jobs a command line asks for."""

    def __init__(self, train_py: str, args, overrides: List[str]):
        from hydra import version
        from hydra._internal.hydra import Hydra
        from hydra._internal.utils import create_automatic_config_search_path, detect_task_name
        from hydra.core.config_search_path import SearchPathQuery

        version.setbase(VERSION_BASE)  # (as train.py's @hydra.main sets it: composition rules, runtime.version_base)

        self.overrides = overrides
        self.config_name = args.config_name or "config"
        path = create_automatic_config_search_path(train_py, None, args.config_path or "conf")
        if args.config_dir is not None:
            d = os.path.abspath(args.config_dir)
            if not os.path.isdir(d):
                raise ConfigError(f"invalid command line: --config-dir {args.config_dir}: no such directory")
            path.prepend(provider="command-line", path=f"file://{d}", anchor=SearchPathQuery(provider="schema"))
        self.search_dirs = [p.path.removeprefix("file://") for p in path.get_path() if "://" not in p.path
                            or p.path.startswith("file://")]
        self.hydra = Hydra.create_main_hydra2(task_name=detect_task_name(train_py, None), config_search_path=path)

    def compose(self, fn, *a, **kw):
        """Run a Hydra composition; its errors become :class:`ConfigError` lines."""
        from hydra.errors import HydraException, MissingConfigException
        from omegaconf.errors import OmegaConfBaseException

        try:
            return fn(*a, **kw)
        except MissingConfigException as e:
            if e.options is None and e.missing_cfg_file:  # the primary config (--config-name)
                names = sorted(p.stem for d in self.search_dirs for p in Path(d).glob("*.yaml"))
                close = difflib.get_close_matches(self.config_name, names, n=1, cutoff=0.6)
                raise ConfigError(f"invalid command line: --config-name {self.config_name}: no such config; allowed: "
                                  f"{' | '.join(names)}" + (f"; did you mean {close[0]}?" if close else "")) from None
            raise ConfigError(explain(e, self.overrides)) from None
        except (HydraException, OmegaConfBaseException) as e:
            raise ConfigError(explain(e, self.overrides)) from None

    def jobs(self, multirun: bool) -> List[List[str]]:
        """Each job's overrides: one job in a single run; the basic sweeper's grid in a multirun (other
        sweepers choose their jobs as they go: only the first composition is checked then). Sets
        :attr:`multirun` (``-m``, or ``hydra.mode=MULTIRUN`` in the config)."""
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from hydra.types import RunMode

        h = self.hydra
        self._single: Optional[DictConfig] = None
        if not multirun:
            try:  # a valid single run: one composition tells the mode and is the job's config (saves ~0.2 s)
                cfg = h.compose_config(self.config_name, self.overrides, run_mode=RunMode.RUN,
                                       with_log_configuration=False)
                multirun = OmegaConf.select(cfg, "hydra.mode") == RunMode.MULTIRUN
                self._single = None if multirun else cfg
            except Exception:  # noqa: BLE001 - anything else (a sweep value with hydra.mode=MULTIRUN, a bad
                # override) takes the full path, which says it as before
                mode = self.compose(h.get_mode, config_name=self.config_name, overrides=self.overrides)
                multirun = mode == RunMode.MULTIRUN
        self.multirun = multirun
        if not multirun:
            return [list(self.overrides)]
        self.master = self.compose(h.compose_config, self.config_name, self.overrides, run_mode=RunMode.MULTIRUN,
                                   with_log_configuration=False)
        sweeper = str(OmegaConf.select(self.master, "hydra.sweeper._target_", default=""))
        if not sweeper.endswith("BasicSweeper"):
            return [[o for o in self.overrides if "," not in o.partition("=")[2]]]
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

        params = OmegaConf.select(self.master, "hydra.sweeper.params") or {}
        given = [f"{k}={v}" for k, v in params.items()] + list(self.overrides)
        parser = OverridesParser.create(config_loader=h.config_loader)
        parsed = self.compose(parser.parse_overrides, given)
        return [list(job) for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]

    def config(self, job: List[str]) -> DictConfig:
        from hydra.types import RunMode

        if self.multirun:
            return self.compose(self.hydra.config_loader.load_sweep_config, self.master, job)
        if getattr(self, "_single", None) is not None and job == list(self.overrides):
            return self._single
        return self.compose(self.hydra.compose_config, self.config_name, job, run_mode=RunMode.RUN,
                            with_log_configuration=False)


class _HandOver:
    """A single run's composition, checked by :func:`preflight`, for ``@hydra.main`` to run (see :func:`hand_over`).
    With ``hydra.mode`` unset, Hydra adds the override ``hydra.mode=RUN`` and composes again: the hand-over adds it
    too. The ``now`` resolver's cache is cleared, so the run dir's time is taken when Hydra makes it, as before."""

    def __init__(self, config_name: str, overrides: List[str], cfg: DictConfig):
        self.config_name, self.mode = config_name, OmegaConf.select(cfg, "hydra.mode")
        self.mode_overrides = list(overrides)
        self.run_overrides = list(overrides) + (["hydra.mode=RUN"] if self.mode is None else [])
        if self.mode is None:  # (Hydra.run then sets hydra.mode itself)
            cfg.hydra.overrides.hydra.append("hydra.mode=RUN")
        OmegaConf.clear_cache(cfg)
        self.cfg: Optional[DictConfig] = cfg
        self.mode_asked = False


_HANDED: Optional[_HandOver] = None


@contextlib.contextmanager
def hand_over():
    """Around ``@hydra.main``'s call: Hydra runs the composition :func:`preflight` checked for a single run instead
    of composing it twice more (once to learn the mode, once to run: ~0.08 s each, a tenth of the time from the
    command to the first env step). Hydra asks through two of its methods, wrapped while the block runs; each is
    answered from the hand-over once, only for the exact arguments Hydra's own path passes and only under the
    Hydra version and version base this was checked on (anything else composes as before). A sweep's jobs are
    composed by Hydra's launcher: nothing is handed over then."""
    global _HANDED
    h, _HANDED = _HANDED, None
    import hydra
    from hydra import version

    if h is None or not hydra.__version__.startswith("1.3.") or str(version.getbase()) != VERSION_BASE:
        yield
        return
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.hydra import Hydra
    from hydra.types import RunMode

    get_mode, load = Hydra.get_mode, ConfigLoaderImpl.load_configuration

    def handed_mode(self, config_name, overrides, *a, **kw):
        if not h.mode_asked and not a and not kw and config_name == h.config_name and list(overrides) == \
                h.mode_overrides:
            h.mode_asked = True
            return h.mode
        return get_mode(self, config_name, overrides, *a, **kw)

    def handed_config(self, config_name, overrides, run_mode, *a, **kw):
        if (h.cfg is not None and h.mode_asked and not a and run_mode == RunMode.RUN
                and kw.get("from_shell", True) and kw.get("validate_sweep_overrides", True)
                and config_name == h.config_name and list(overrides) == h.run_overrides):
            cfg, h.cfg = h.cfg, None
            return cfg
        return load(self, config_name, overrides, run_mode, *a, **kw)

    Hydra.get_mode = handed_mode
    ConfigLoaderImpl.load_configuration = handed_config
    try:
        yield
    finally:
        Hydra.get_mode, ConfigLoaderImpl.load_configuration = get_mode, load


def check_jobs(jobs: Jobs, multirun: bool) -> int:
    """Compose and check every job; raises :class:`ConfigError` for the first that fails (naming the job in a
    sweep, and how many fail). Returns the number of jobs."""
    from .checks import env_spec, prestart

    todo = jobs.jobs(multirun)
    specs: Dict[str, object] = {}
    failed: List[str] = []
    for i, job in enumerate(todo):
        try:
            c = validate(task_config(jobs.config(job)))
            key = json.dumps(dataclasses.asdict(c.env), sort_keys=True, default=str)
            if key not in specs:
                specs[key] = env_spec(c)
            prestart(c, specs[key])  # type: ignore[arg-type]
        except ConfigError as e:
            if not jobs.multirun:
                raise
            varying = [o for o in job if sum(o in other for other in todo) < len(todo)]
            failed.append(f"job #{i} ({' '.join(varying) or 'every job'}): {e}")
    if failed:
        more = f" ({len(failed)} of {len(todo)} jobs fail; nothing was started)" if len(failed) > 1 else ""
        raise ConfigError(failed[0] + more)
    return len(todo)


def preflight(argv: List[str], train_py: str) -> List[str]:
    """Check the command line ``argv`` (``sys.argv``) of ``train_py`` before Hydra runs it; returns the argv to
    run (``resume=`` values quoted where Hydra's grammar needs it). Raises :class:`ConfigError`."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.global_hydra import GlobalHydra

    global _HANDED
    _HANDED = None
    argv = [argv[0]] + [quote_resume(a) for a in argv[1:]]
    args = get_args_parser().parse_args(argv[1:])
    if args.run + args.multirun + (args.cfg is not None) + args.shell_completion + (args.info is not None) > 1:
        raise ConfigError("invalid command line: --run, --multirun (-m), --cfg, --info and --shell-completion "
                          "exclude each other; allowed: one of them")
    if any(getattr(args, f, None) for f in INFO_FLAGS) or getattr(args, "cfg", None) is not None:
        return argv
    try:
        jobs = Jobs(train_py, args, list(args.overrides))
        check_jobs(jobs, bool(args.multirun))
    finally:
        GlobalHydra.instance().clear()
    if not jobs.multirun and jobs._single is not None:  # (set by check_jobs' jobs.jobs())
        _HANDED = _HandOver(jobs.config_name, jobs.overrides, jobs._single)
    return argv
