"""What a launch says before the job's output (issue 13): one decision line for every
strategy, an updating status line on a terminal that is erased before anything else is
written, one line per stage in a log."""
from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers_common import EXAMPLES, fixture_path, own_lines
from smartlaunch.statusline import StatusLine

PAIR = {"SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path("h200-nv18-pair")}
TRAIN = [str(EXAMPLES / "train.py"), "--steps", "300", "--warmup", "1"]


def smartlaunch(args, cwd, env_extra=None, timeout=180):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "smartlaunch.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def on_terminal(args, cwd, env_extra=None, timeout=180, watch=None) -> tuple[int, bytes]:
    """Run with stdout and stderr on one pseudo-terminal, as in an interactive shell;
    watch(output so far) is called after every read."""
    master, slave = pty.openpty()
    env = {**os.environ, **(env_extra or {})}
    proc = subprocess.Popen([sys.executable, "-m", "smartlaunch.cli", *args], cwd=cwd, env=env,
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    out, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = os.read(master, 65536)
        except OSError:           # EIO: every writer closed the terminal
            break
        if not chunk:
            break
        out += chunk
        if watch is not None:
            watch(out)
    os.close(master)
    return proc.wait(timeout=30), out


def run_end(line: str) -> bool:
    """A line the run writes at its end, not the decision: a DDP run's one-line summary
    (issue 18) and, when DDP ran below the policy's threshold, the advice for the next
    launch (issue 15, item 6)."""
    return line.startswith("smartlaunch: summary (") or "the next launch of this job" in line


def screen(raw: bytes) -> list[str]:
    """The lines a terminal shows for this output: \\r returns, ESC[K erases to line end."""
    lines, cur, col = [], [], 0
    text = raw.decode(errors="replace")
    i = 0
    while i < len(text):
        ch = text[i]
        if text.startswith("\x1b[K", i):
            del cur[col:]
            i += 3
            continue
        m = re.match(r"\x1b\[[0-9;?]*[A-Za-z]", text[i:])
        if m:                     # other control sequences: not ours, ignored
            i += m.end()
            continue
        if ch == "\r":
            col = 0
        elif ch == "\n":
            lines.append("".join(cur))
            cur, col = [], 0
        else:
            if col < len(cur):
                cur[col] = ch
            else:
                cur.append(ch)
            col += 1
        i += 1
    if cur:
        lines.append("".join(cur))
    return lines


@pytest.mark.slow
def test_cold_decision_on_a_terminal_leaves_only_the_decision_line(clean_env):
    rc, raw = on_terminal(["--reprofile", *TRAIN], clean_env, PAIR)
    shown = screen(raw)
    assert rc == 0, "\n".join(shown)
    assert b"\r\x1b[K" in raw and b"profiling" in raw and b"measuring all-reduce" in raw
    ours = [line for line in shown if line.startswith("smartlaunch:")]
    # The decision line before the job; then the run's own end lines.
    while ours and run_end(ours[-1]):
        ours.pop()
    assert len(ours) == 1, shown
    # DDP or, when a loaded machine's trials say so, single: either way with its number.
    # And what it does to the global batch (the dry run saw the per-rank batch).
    assert re.fullmatch(r"smartlaunch: (DDP×2 on GPUs 0,1 \(NV18\) — |single process on GPU\d — "
                        r"DDP×2 )(predicted|measured) \d+\.\d\d× one GPU"
                        # single: DDP's efficiency against the policy's floor, or the mean of
                        # the draws measured near it
                        r"( \((\d+(\.\d)?% efficiency|\d+(\.\d)?%, below the policy's \d+%|"
                        r"mean of \d trials: \d+% ± \d+%(, below the policy's \d+%)?)\))?"
                        r"( \(superlinear on 2 GPUs: --explain says why\))?; global batch "
                        r"[12] × \d+ = [\d,]+(; --nproc-per-node 2 would give [\d,]+)?; "
                        r"--explain for why", ours[0]), ours
    assert not any("profiling" in line or "all-reduce" in line for line in shown), shown
    assert any(line.startswith("model=") for line in shown)
    assert shown.index(ours[0]) < next(i for i, line in enumerate(shown) if line.startswith("model="))


def test_ddp_steps_line_is_erased_before_the_jobs_output(clean_env):
    script = clean_env / "late.py"
    # one write a line: the ranks' unbuffered print() of several words interleaves (python -u)
    script.write_text("import os, sys, time\ntime.sleep(2.5)\nsys.stdout.write("
                      "f\"rank {os.environ['RANK']} done\\n\")\ntime.sleep(1.5)\n")
    rc, raw = on_terminal(["--strategy", "ddp", "--nproc-per-node", "2", str(script)], clean_env)
    shown = screen(raw)
    assert rc == 0, shown
    assert b"smartlaunch: steps" in raw          # the live line was drawn meanwhile
    assert sorted(line for line in shown if "done" in line) == ["rank 0 done", "rank 1 done"]
    assert not any("smartlaunch: steps" in line for line in shown), shown


@pytest.mark.slow
def test_stages_in_a_log_are_one_line_each_without_carriage_returns(clean_env):
    r = smartlaunch(["--reprofile", *TRAIN], clean_env, PAIR)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "\r" not in r.stderr
    ours = [line for line in own_lines(r.stderr) if line.startswith("smartlaunch:")]
    while ours and run_end(ours[-1]):
        ours.pop()
    words = [line.split(" ", 2)[1] for line in ours]
    # A loaded machine may land in the uncertainty band: then trials follow, one line each.
    assert words[0] == "profiling" and words[-1] in ("DDP×2", "single"), ours
    assert set(words[1:-1]) <= {"measuring", "trial"} and len(set(ours)) == len(ours), ours
    # Again: the profile and the all-reduce curve are read from the cache, and no line says
    # they are being measured.
    warm = smartlaunch(["--explain", *TRAIN], clean_env, PAIR)
    assert warm.returncode == 0, warm.stderr[-2000:]
    said = [line for line in own_lines(warm.stderr) if line.startswith("smartlaunch:")]
    assert not any(w in line for line in said for w in ("profiling", "measuring")), said
    assert "all-reduce (gloo, GPUs 0,1, cached)" in warm.stdout, warm.stdout


@pytest.mark.parametrize("args, want", [
    (["--strategy", "single"], "smartlaunch: single process on GPU0 — forced by --strategy single"),
    (["--strategy", "ddp"], "smartlaunch: DDP×2 on GPUs 0,1 (NV18) — forced by --strategy ddp; "
                            "global batch = 2 × the per-rank batch"),
    (["--strategy", "independent", "--each", "--seed 1", "--each", "--seed 2"],
     "smartlaunch: 2 independent single-GPU jobs on GPUs 0,1 — forced by --strategy independent"),
])
def test_every_strategy_prints_one_decision_line_first(clean_env, args, want):
    script = clean_env / "hello.py"
    script.write_text("import sys\nprint('job says hi', file=sys.stderr, flush=True)\n")
    r = smartlaunch([*args, str(script)], clean_env, PAIR)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = own_lines(r.stderr)
    assert lines[0] == want + "; --explain for why", lines
    if "independent" not in args:           # independent jobs write to their own logs
        # Every rank's line arrives, after the decision line. Not compared line by line: the
        # ranks run `python -u`, as under torchrun, so print() writes the text and its newline
        # separately and two ranks may interleave ("job says hijob says hi"), with or
        # without smartlaunch's copiers.
        after = r.stderr.split(lines[0], 1)[1]
        assert after.count("job says hi") == (2 if "ddp" in args else 1), r.stderr


def test_quiet_flag_and_policy_key_turn_the_line_off(clean_env):
    script = clean_env / "hello.py"
    script.write_text("print('hi')\n")
    r = smartlaunch(["--quiet", "--strategy", "single", str(script)], clean_env, PAIR)
    assert (r.returncode, own_lines(r.stderr), r.stdout) == (0, [], "hi\n")
    (clean_env / "smartlaunch.yaml").write_text("launch: {quiet: true}\n")
    r = smartlaunch(["--strategy", "single", str(script)], clean_env, PAIR)
    assert (r.returncode, own_lines(r.stderr), r.stdout) == (0, [], "hi\n")


class Term:
    def __init__(self):
        self.data = ""

    def write(self, s):
        self.data += s

    def flush(self):
        pass


def test_status_line_in_a_log_repeats_at_most_once_per_interval():
    now = [0.0]
    out = Term()
    status = StatusLine(out, tty=False, every_s=60, clock=lambda: now[0])
    status.stage("waiting")
    for t in range(1, 150):
        now[0] = float(t)
        status.update(f"waiting {t} s")
    status.line("done")
    assert out.data.splitlines() == ["smartlaunch: waiting", "smartlaunch: waiting 60 s",
                                     "smartlaunch: waiting 120 s", "smartlaunch: done"]


def _hold_both_gpus(clean_env):
    from smartlaunch.launch.leases import LeaseManager
    from smartlaunch.topology.fake import from_json
    manager = LeaseManager(os.environ["SMARTLAUNCH_LEASE_DIR"])
    return manager, manager.acquire(from_json("h200-nv18-pair", {}), [0, 1], 2, wait=False,
                                    timeout_s=0)


@pytest.mark.parametrize("terminal", [pytest.param(True, marks=pytest.mark.slow), False])
def test_a_waiting_launch_shows_its_place_and_the_holder(clean_env, terminal):
    import threading
    script = clean_env / "hello.py"
    script.write_text("print('job ran')\n")
    manager, lease = _hold_both_gpus(clean_env)
    released = threading.Event()

    def watch(out: bytes) -> None:      # let it wait a while once it says so, then free a GPU
        if b"waiting for" in out and not released.is_set():
            released.set()
            threading.Timer(4.5, lease.release).start()
    args = ["--strategy", "single", str(script)]
    try:
        if terminal:
            rc, raw = on_terminal(args, clean_env, PAIR, watch=watch)
            err, shown = raw.decode(), screen(raw)
        else:
            proc = subprocess.Popen([sys.executable, "-m", "smartlaunch.cli", *args], cwd=clean_env,
                                    env={**os.environ, **PAIR}, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
            err = ""
            for line in proc.stderr:
                err += line
                watch(err.encode())
            out = proc.stdout.read()
            rc, shown = proc.wait(timeout=60), own_lines(err) + out.splitlines()
    finally:
        lease.release()
        manager.close()
    assert rc == 0, err
    waiting = re.findall(r"smartlaunch: (waiting for 1 GPU\(s\) of 0,1: 1st of 1 in the queue; "
                         r"GPUs 0,1 are leased by pid (\d+)[^\r\n\x1b]*waited (\d+) s)", err)
    assert waiting and {int(w[1]) for w in waiting} == {os.getpid()}, err
    if terminal:      # redrawn in place as it waits, gone once the job runs
        assert len({w[2] for w in waiting}) >= 2
        assert not any("waiting" in line for line in shown), shown
    else:             # a log: one line for the wait, whatever its length
        assert len(waiting) == 1
    assert shown[-1] == "job ran"
    assert not list(Path(os.environ["SMARTLAUNCH_LEASE_DIR"]).glob("*.waiter"))


# A band wide enough that every cold decision measures DDP×2 by trial (issue 15, item 7: the
# trials must be visible too), each trial short.
TRIALS = "decision: {uncertainty_band: 2.0, trial_seconds: 0.2, trial_steps: 5}\n"


@pytest.mark.slow
def test_cold_decision_on_a_terminal_shows_step_size_and_trial_progress(clean_env):
    (clean_env / "smartlaunch.yaml").write_text(TRIALS)
    rc, raw = on_terminal(["--reprofile", *TRAIN], clean_env, PAIR)
    shown = screen(raw)
    assert rc == 0, "\n".join(shown)
    text = raw.decode(errors="replace")
    steps = [(int(k), int(n)) for k, n in re.findall(r"dry run step (\d+) of (\d+)", text)]
    assert steps and all(1 <= k <= n for k, n in steps), text
    assert steps == sorted(steps)                       # it counts up, redrawn in place
    sizes = re.findall(r"all-reduce ([\d.]+ [KMG]?B) \((\d) of (\d) sizes\)", text)
    assert all(1 <= int(k) <= int(n) for _, k, n in sizes), text
    # With 4+ cores the sweep ran beside the dry run (driver.Driver._start_early) and had ended by then.
    assert sizes or "(started with the dry run; cached afterwards)" in text, text
    # One GPU is answered by the dry run when its window was as long as a trial's; on a slow
    # machine the 300-step script cuts it short, and then one GPU is a trial of its own.
    k, n = map(int, re.search(r"trial (\d) of (\d): DDP×2 on GPUs 0,1", text).groups())
    assert k == n and (n == 1 or re.search(r"trial 1 of 2: single GPU on GPU0", text)), text
    # All of it gone from the screen: only the decision line, then the job's output.
    ours = [line for line in shown if line.startswith("smartlaunch:") and not run_end(line)]
    assert len(ours) == 1 and "measured" in ours[0], shown
    assert not any(w in line for line in shown for w in ("dry run step", "sizes)", "trial ")), shown
    assert shown.index(ours[0]) < next(i for i, line in enumerate(shown) if line.startswith("model="))


@pytest.mark.slow
def test_cold_decision_on_a_pipe_writes_one_line_per_stage_and_no_counts(clean_env):
    (clean_env / "smartlaunch.yaml").write_text(TRIALS)
    r = smartlaunch(["--reprofile", *TRAIN], clean_env, PAIR)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "\r" not in r.stderr and "\x1b" not in r.stderr
    assert "dry run step" not in r.stderr and "sizes)" not in r.stderr, r.stderr
    ours = [line for line in own_lines(r.stderr) if line.startswith("smartlaunch:")]
    assert ours[0].startswith("smartlaunch: profiling "), ours
    assert ours[1].startswith("smartlaunch: measuring all-reduce over GPUs 0,1 up to "), ours
    # Then one line a trial, numbered in order: DDP×2 (after one GPU where the dry run does
    # not stand for it; one GPU again where a loaded CPU measures DDP×2 above 2×; DDP×2 again
    # where its efficiency lands near the policy's floor).
    end = 2
    while end < len(ours) and ours[end].startswith("smartlaunch: trial "):
        end += 1
    trials = ours[2:end]
    assert any("DDP×2 on GPUs 0,1" in t for t in trials), ours
    numbers = [int(re.match(r"smartlaunch: trial (\d+) of \d+: ", t).group(1)) for t in trials]
    assert numbers == list(range(1, len(trials) + 1)), ours
    assert re.match(r"smartlaunch: (DDP×2 on GPUs 0,1 \(NV18\) — |single process on GPU0 — "
                    r"DDP×2 )measured ", ours[end]), ours
    assert all(run_end(line) for line in ours[end + 1:]), ours    # then the run's end


def test_status_progress_redraws_a_ticking_stage_on_a_terminal_only():
    for tty in (True, False):
        out, now = Term(), [10.0]
        status = StatusLine(out, tty=tty, clock=lambda: now[0])
        status.ticking("profiling x.py")
        now[0] = 13.0
        status.progress("profiling x.py: dry run step 3 of 26")
        status.clear()
        status.progress("late: the stage is over")      # ignored once the stage ended
        status.close()
        if tty:
            assert screen(out.data.encode()) == []
            assert "\rsmartlaunch: profiling x.py: dry run step 3 of 26 (3 s)\x1b[K" in out.data
            assert "late" not in out.data
        else:
            assert out.data == "smartlaunch: profiling x.py\n"
