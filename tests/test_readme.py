"""Every command in the READMEs runs. The fenced ``bash`` blocks of README.md, sweeps/README.md and
benchmarks/README.md are read; each ``python train.py`` / ``python evaluate.py`` / ``python -m analysis.report``
line is run as written, in order, with tiny budgets appended (a later override wins in Hydra) and its output
dirs in a temporary dir; placeholders (``<run dir>``, ``outputs/<date>/<time>_...``, ``multirun/<date>/<time>``)
become a run or sweep dir that an earlier command of the READMEs made. A command the test does not know how to
run fails the test, unless a rule in SKIP says why CI cannot run it.

To stay within a few minutes, the commands run in one Python process (``python tests/test_readme.py``, below):
each is executed as its script runs from a shell (``runpy``, ``sys.argv`` as the shell would split and glob
it, its exit code from ``SystemExit``), which spares a torch import per command. A sweep config's grid is
narrowed to its first point (a command-line value narrows it, as sweeps/README.md says); sweeps given on the
command line run whole."""
import glob
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READMES = ["README.md", "sweeps/README.md", "benchmarks/README.md"]
RUNNABLE = ("python train.py", "python evaluate.py", "python -m analysis.report", "python -m analysis.doctor",
            "python -m analysis.queue_lab", "python -m laglab.sim")
SKIP = [  # (pattern, why CI does not run it here)
    (r"^pip install", "installs packages (.ci/run installs the project with its extras before the suite)"),
    (r"^python -m pytest", "the test suite itself"),
    (r"^ray start|runner\.address=auto", "needs a multi-node Ray cluster (tests/test_ray.py starts one on this machine)"),
    (r"submitit_slurm", "needs a SLURM cluster"),
    (r"^python benchmarks/", "benchmarks run for minutes by design and print ratios, not pass/fail"),
]
# what a tiny run appends (Hydra: the last value of a key wins); these keys stay out of a sweep job's dir name
TINY = {"total_env_steps": "2048", "learner.batch_size": "512", "tracking.wandb.mode": "disabled",
        "tracking.progress": "false", "tracking.console_every_s": "1e9"}


def readme_commands():
    """[(file, command)] of every fenced bash block, comments dropped, continuations joined, ``;`` split."""
    out = []
    for name in READMES:
        text = (ROOT / name).read_text()
        for block in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M):
            block = re.sub(r"\\\n\s*", " ", block)
            for line in block.splitlines():
                line = re.sub(r"(^|\s)#.*$", "", line).strip()
                for cmd in line.split(";"):
                    cmd = " ".join(w for w in cmd.split() if w != "...")
                    if cmd:
                        out.append((name, cmd))
    return out


def skip_reason(cmd):
    return next((why for pattern, why in SKIP if re.search(pattern, cmd)), None)


def sweep_params(argv):
    """The sweeper params of ``--config-name X`` from ``--config-dir D`` (a study file), else {}."""
    if "--config-name" not in argv or "--config-dir" not in argv:
        return {}
    import yaml

    path = ROOT / argv[argv.index("--config-dir") + 1] / f"{argv[argv.index('--config-name') + 1]}.yaml"
    return yaml.safe_load(path.read_text())["hydra"]["sweeper"]["params"]


def tiny_train(argv, tmp, i):
    """train.py's argv with the tiny budget, its dirs under ``tmp``, a study's grid narrowed to its first point."""
    given = {a.lstrip("+~").split("=", 1)[0] for a in argv if "=" in a and not a.startswith("-")}
    extra = dict(TINY)
    if any(a.startswith("resume=") for a in argv):
        extra["total_env_steps"] = "4096"  # more than the run it resumes (a spent budget is refused)
    if "learner.checkpoint_every" not in given:
        extra["learner.checkpoint_every"] = "1"  # so `evaluate.py --checkpoint latest` has a latest.pt
    for key, values in sweep_params(argv).items():
        if key not in given:
            extra[key] = str(values).split(",")[0]
    out = argv + [f"{k}={v}" for k, v in extra.items()] + [f"hydra.run.dir={tmp}/run_{i}", f"hydra.sweep.dir={tmp}/sweep_{i}"]
    if "-m" in argv:
        out.append(f"hydra.job.config.override_dirname.exclude_keys=[{','.join(TINY)},learner.checkpoint_every]")
    # options before overrides: argparse takes the overrides as one run of positionals
    flags, overrides, k = [], [], 1
    while k < len(out):
        if out[k].startswith("--config") or out[k] in ("-cp", "-cn", "-cd"):
            flags += out[k:k + 2]
            k += 2
        else:
            (flags if out[k].startswith("-") else overrides).append(out[k])
            k += 1
    return [out[0], *flags, *overrides]


def substitute(cmd, runs, sweeps, tmp, i):
    """Placeholders -> dirs made by earlier commands; ``--out`` -> a temporary dir."""
    cmd = re.sub(r"outputs/<date>/<time>_ppo_a(\d+|<n>)_s0", "<run dir>", cmd)  # (the count actors=auto chose)
    for ph in ("outputs/<that run>", "<run dir>"):
        if ph in cmd:
            assert runs, f"{cmd}: no run made before it"
            cmd = cmd.replace(ph, runs[-1])
    m = re.search(r"multirun/<date>/<time>(\S*)", cmd)
    if m:
        found = [d for d in reversed(sweeps) if glob.glob(d + m.group(1))]
        assert found, f"{cmd}: no sweep made before it has {m.group(1) or 'jobs'}"
        cmd = cmd.replace("multirun/<date>/<time>", found[0])
    return re.sub(r"--out \S+", f"--out {tmp}/report_{i}", cmd)


def run_all(commands, tmp):
    """Run every command in this process; returns [{cmd, argv, rc, log}] (the harness, see the docstring)."""
    import runpy

    runs, sweeps, results = [], [], []
    for i, cmd in enumerate(commands):
        cmd = substitute(cmd, runs, sweeps, tmp, i)
        assert "<" not in cmd, f"an unknown placeholder in: {cmd}"
        words = shlex.split(cmd)
        argv = [w2 for w in words[1:] for w2 in (sorted(glob.glob(w)) or [w] if "*" in w else [w])]
        if argv[0] == "train.py":
            argv = tiny_train(argv, tmp, i)
        log = Path(tmp) / f"log_{i}.txt"
        saved = os.dup(1), os.dup(2)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(fd, 1), os.dup2(fd, 2)
        sys.argv = list(argv[1:] if argv[0] == "-m" else argv)
        rc, t0 = 0, time.perf_counter()
        try:
            if argv[0] == "-m":
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(str(ROOT / argv[0]), run_name="__main__")
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException as e:  # noqa: BLE001 - reported as the command's failure
            import traceback

            traceback.print_exc()
            rc = f"{type(e).__name__}: {e}"
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.close(fd), os.close(saved[0]), os.close(saved[1])
        if argv[0] == "train.py" and rc == 0:
            (sweeps if "-m" in argv else runs).append(f"{tmp}/{'sweep' if '-m' in argv else 'run'}_{i}")
        results.append({"cmd": cmd, "argv": argv, "rc": rc, "log": log.read_text()[-4000:],
                        "s": round(time.perf_counter() - t0, 1)})
    return results


def test_every_readme_command_runs(tmp_path):
    commands, skipped, unknown = [], [], []
    for name, cmd in readme_commands():
        why = skip_reason(cmd)
        if why:
            skipped.append((cmd, why))
        elif cmd.startswith(RUNNABLE):
            if cmd not in commands:  # a command shown twice runs once
                commands.append(cmd)
        else:
            unknown.append(f"{name}: {cmd}")
    assert not unknown, f"README commands this test cannot run (run them here, or add a SKIP rule saying why): {unknown}"
    # the READMEs' commands are found; skips stay few (benchmark commands aside: benchmarks/README.md lists them by
    # design, and none of them is a user's first command)
    assert len(commands) >= 25 and len([c for c, _ in skipped if not c.startswith("python benchmarks/")]) <= 9
    before = {d: sorted(os.listdir(ROOT / d)) if (ROOT / d).exists() else None for d in ("outputs", "multirun", "reports")}
    # every process the commands start (actors, submitit's jobs) imports this tree's laglab, as CI's checkout would
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "platform"), str(ROOT)]))
    p = subprocess.run([sys.executable, __file__, str(tmp_path), json.dumps(commands)], cwd=ROOT, capture_output=True,
                       text=True, timeout=900, env=env)
    assert p.returncode == 0, p.stderr[-5000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert [r["cmd"] for r in results] and len(results) == len(commands)
    failed = [f"$ {r['cmd']}\n  argv: {' '.join(r['argv'])}\n  exit {r['rc']}\n{r['log']}" for r in results if r["rc"] != 0]
    assert not failed, "\n\n".join(failed)
    after = {d: sorted(os.listdir(ROOT / d)) if (ROOT / d).exists() else None for d in before}
    assert after == before  # nothing was written into the repo


if __name__ == "__main__":  # the harness: python tests/test_readme.py <tmp dir> <json list of commands>
    sys.path.insert(0, str(ROOT))  # `python -m analysis.report` finds the package from the repo root
    tmp, todo = sys.argv[1], json.loads(sys.argv[2])  # (each command replaces sys.argv)
    (Path(tmp) / "results.json").write_text(json.dumps(run_all(todo, tmp)))
