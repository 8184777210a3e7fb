"""Runtime diagnosis (issue 18): straggler math and text, drift, summary, the work timer, the
Flight Recorder wiring; the real gloo jobs with a slow rank are in test_diagnosis_launch.py."""
from __future__ import annotations

import os
import pickle
import threading
import time

import pytest

from smartlaunch.launch import flightrec
from smartlaunch.launch.monitor import RunMonitor
from smartlaunch.launch.progress import ProgressRecord
from smartlaunch.launch.straggler import (GpuSample, RunFigures, Straggler, clock_drift,
                                          find_slow_worker, likely_cause, rate_trend,
                                          straggler_text, summary_text)
from smartlaunch.launch.worktime import WorkRecord, WorkTimer, WorkWriter, read_work, work_path
from smartlaunch.policy.api import LaunchPolicy


def sample(t, gpu, clock, reasons=(), util=99, temp=70):
    return GpuSample(t, gpu, clock, 1980, temp, 600.0, 700.0, util, tuple(reasons))


# ---- the straggler math -------------------------------------------------------------------
def test_slow_worker_found_from_work_not_rates():
    # Synchronous DDP: equal step (73 ms) on every rank; rank 1 works 72 ms, the others 21 ms.
    assert find_slow_worker({0: 0.021, 1: 0.072}, 0.073, 0.15) == 1
    assert find_slow_worker({0: 0.050, 1: 0.050, 2: 0.050, 3: 0.060}, 0.070, 0.15) == 3


def test_slow_worker_needs_threshold_and_a_cost():
    assert find_slow_worker({0: 0.050, 1: 0.055}, 0.060, 0.15) is None     # 10% < 15%
    # 2x slower, but 1 ms of a 100 ms communication-bound step: not worth a warning.
    assert find_slow_worker({0: 0.001, 1: 0.002}, 0.100, 0.15) is None
    assert find_slow_worker({0: 0.05}, 0.05, 0.15) is None


def test_lost_share_is_the_wait_the_others_pay():
    st = Straggler(1, 1, work_s=0.071, others_s=0.050, step_s=0.075, window_s=30, clock="CUDA events", gpu=1)
    assert st.slowdown == pytest.approx(0.42)
    assert st.lost_share == pytest.approx(0.28)


def test_warning_names_rank_gpu_slowdown_and_nvml_cause():
    st = Straggler(1, 1, 0.071, 0.050, 0.075, 30, "CUDA events", gpu=1)
    text = straggler_text(st, sample(0, 1, 1410, ["sw_thermal_slowdown"], temp=87), [sample(0, 0, 1980)])
    assert text.startswith("smartlaunch: warning: rank 1 (GPU1) computes 42% slower than the others")
    assert "71.0 ms of work per step against 50.0 ms (CUDA events, last 30 s)" in text
    assert "costing the job 28% of its throughput" in text
    assert "GPU1 holds 1,410 of 1,980 MHz (others 1,980 MHz): thermal slowdown; 87 C, 600/700 W, 99% busy." in text


@pytest.mark.parametrize("s, expect", [
    (sample(0, 1, 1500, ["sw_power_cap"]), "GPU1 holds 1,500 of 1,980 MHz: power cap"),
    (sample(0, 1, 1500), "clock held low without a throttle reason"),
    (sample(0, 1, 1980, util=30), "only 30% busy: the GPU waits for its host side"),
    (sample(0, 1, 1980), "no throttling: the rank has more work per step"),
    (None, "no NVML reading"),
])
def test_likely_cause(s, expect):
    assert expect in likely_cause(s)


# ---- drift, trend, summary ----------------------------------------------------------------
def test_clock_drift_warns_with_numbers():
    busy = [sample(t, 1, c, temp=60 + t // 10) for t, c in
            [(0, 1980), (5, 1980), (10, 1975), (600, 1500), (605, 1420), (610, 1410)]]
    busy[-1] = sample(610, 1, 1410, ["hw_thermal_slowdown"], temp=88)
    text = clock_drift(busy, 0.10)
    assert text == ("smartlaunch: warning: GPU1 clock fell from 1,980 to 1,420 MHz (-28%) under the "
                    "same load over 10.2 min, 60 -> 88 C, 600 W; thermal slowdown (hardware).")
    assert clock_drift(busy[:3] + [sample(600, 1, 1900)] * 3, 0.10) is None    # -4%
    assert clock_drift(busy[:5], 0.10) is None                                 # too few samples


def test_idle_samples_do_not_count_as_drift():
    track = [sample(t, 0, 1980) for t in range(3)] + [sample(10 + t, 0, 345, ["gpu_idle"], util=0) for t in range(3)]
    mon = RunMonitor(LaunchPolicy(gpu_sample_s=0.0), sample_gpus=iter([[s] for s in track]).__next__)
    for i in range(6):
        mon.observe(float(i), {})
    assert mon.warnings == []


def test_rate_trend_first_and_last_tenth():
    # 10 steps/s for 50 s, then 8 steps/s for 50 s.
    hist = [(float(t), 10 * t if t <= 50 else 500 + 8 * (t - 50)) for t in range(0, 101)]
    first, last = rate_trend(hist)
    assert first == pytest.approx(10.0) and last == pytest.approx(8.0)


def test_summary_text():
    f = RunFigures(steps={0: 1407, 1: 1407}, window={0: (1406, 74.0), 1: (1406, 74.0)}, batch=64,
                   single_step_s=0.040,
                   trend=(19.5, 18.5), warnings=["smartlaunch: warning: rank 1 computes 3.4x slower"],
                   lost_share=0.69, log_dir="/l", run_dir="/r", dumps=["/r/stacks/local0.txt"])
    assert summary_text(f, "succeeded").splitlines() == [
        "smartlaunch: summary (succeeded): 1,407 steps; 2,432.0 samples/s (1,216.0 samples/s a "
        "rank, 2 ranks)",
        "  DDP efficiency 76% (step 52.6 ms measured against 40.0 ms on one GPU in the dry run)",
        "  step rate 19.50/s in the first 10% of the run, 18.50/s in the last 10% (-5.1%)",
        "  throughput lost to the straggler: 69%",
        "  warnings: 1",
        "    - rank 1 computes 3.4x slower",
        "  logs: /l",
        "  run files (progress, stacks, Flight Recorder, GPU samples): /r",
        "  dumps: /r/stacks/local0.txt",
    ]


def test_summary_rates_of_ranks_that_did_not_step_together_are_each_given_with_why():
    f = RunFigures(steps={0: 500, 1: 400}, window={0: (490, 10.0), 1: (390, 10.0)})
    head = summary_text(f, "succeeded").splitlines()[0]
    assert head.startswith("smartlaunch: summary (succeeded): 500 steps; rank 0: 49.00 steps/s, "
                           "rank 1: 39.00 steps/s (each from its step 10 to its last")
    one = RunFigures(steps={0: 500}, window={0: (490, 10.0)}, batch=8)
    assert summary_text(one, "succeeded").splitlines()[0].endswith("; 392.0 samples/s a rank")
    short = RunFigures(steps={0: 5, 1: 4}, window={0: (4, 0.1), 1: (3, 0.1)})   # never past 10
    assert "(each from its first step to its last" in summary_text(short, "succeeded")


# ---- the monitor on synthetic per-rank timings and replayed NVML samples ---------------------
def test_gpu_samples_that_cannot_be_written_are_said_once_and_the_run_goes_on(tmp_path):
    # A full disk under the run directory: the watchdog printed "watchdog error" at every
    # sample (every launch.gpu_sample_s for the rest of the job).
    import resource
    policy = LaunchPolicy(gpu_sample_s=1.0)
    out = []
    path = tmp_path / "s.jsonl"
    mon = RunMonitor(policy, gpu_of=lambda lr: lr, sample_gpus=lambda: [sample(0, 0, 1980)],
                     record_to=str(path),
                     out=type("W", (), {"write": out.append, "flush": lambda s: None})())
    ranks = {0: (ProgressRecord(100, 0, 0, 10, 0.0, 0.0, 0.0, None), None)}
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    mon.observe(0.0, ranks)
    size = path.stat().st_size
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))     # the next line cannot fit
    try:
        for t in range(1, 6):
            mon.observe(float(t), ranks)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    said = [w for w in "".join(out).splitlines() if w]
    assert said == [f"smartlaunch: GPU samples no longer kept in {path} (File too large); "
                    f"the job goes on"]
    assert path.stat().st_size == size and len(mon._gpus[0].samples()) == 6


def test_monitor_names_straggler_within_the_window(tmp_path):
    policy = LaunchPolicy(straggler_window_s=10.0, gpu_sample_s=2.0)
    replay = lambda: [sample(0, 0, 1980), sample(0, 1, 1410, ["sw_thermal_slowdown"])]   # noqa: E731
    out = []
    mon = RunMonitor(policy, gpu_of=lambda lr: lr, sample_gpus=replay,
                     record_to=str(tmp_path / "s.jsonl"), out=type("W", (), {"write": out.append, "flush": lambda s: None})())
    step_s, work = 0.1, {0: 0.070, 1: 0.098}          # rank 1 works 40% longer
    for i in range(0, 121):                            # 12 s of looks, every 0.1 s
        t = i * 0.1
        ranks = {lr: (ProgressRecord(100 + lr, lr, lr, i + 10, 0.0, 0.0, t, None),
                      WorkRecord(i, i * work[lr], "cuda")) for lr in (0, 1)}
        mon.observe(t, ranks)
        if mon.straggler:
            break
    assert mon.straggler is not None and mon.straggler.rank == 1
    assert 9.0 <= t <= 10.5                            # within the policy window
    assert mon.straggler.slowdown == pytest.approx(0.40, abs=0.01)
    assert "GPU1 holds 1,410 of 1,980 MHz (others 1,980 MHz): thermal slowdown" in mon.warnings[0]
    assert (tmp_path / "s.jsonl").read_text().count("\n") >= 2


# ---- the work timer, in this process -------------------------------------------------------
def test_work_record_round_trip(tmp_path):
    w = WorkWriter(work_path(tmp_path, 3))
    w.add(0.25)
    w.add(0.5)
    assert read_work(work_path(tmp_path, 3)) == WorkRecord(2, 0.75, "cpu")
    assert read_work(tmp_path / "missing") is None


def test_work_timer_counts_data_and_compute_not_the_wait(tmp_path):
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    timer = WorkTimer(WorkWriter(work_path(tmp_path, 0)), every_s=0)
    from torch.optim.optimizer import register_optimizer_step_post_hook
    handle = register_optimizer_step_post_hook(timer._after_step)
    try:
        for _ in range(6):
            time.sleep(0.03)                     # "data loading": work
            model(torch.randn(2, 4)).sum().backward()
            time.sleep(0.05)                     # after backward, before the step: a wait
            opt.step()
            opt.zero_grad()
    finally:
        handle.remove()
    rec = read_work(work_path(tmp_path, 0))
    assert rec.steps == 5                        # the first step only starts the clock
    assert 0.03 <= rec.work_s / rec.steps < 0.07


def _timed_steps(tmp_path, model, opt, inputs, loss, every_s=0.0, pause=0.0):
    """Run the steps under a WorkTimer (every_s: as WorkTimer's), each step `pause` seconds
    longer; (the timer, its record)."""
    timer = WorkTimer(WorkWriter(work_path(tmp_path, 0)), every_s=every_s)
    from torch.optim.optimizer import register_optimizer_step_post_hook
    handle = register_optimizer_step_post_hook(timer._after_step)
    try:
        for x in inputs:
            time.sleep(pause)
            loss(model, x).backward()
            opt.step()
            opt.zero_grad()
    finally:
        handle.remove()
    return timer, read_work(work_path(tmp_path, 0))


def test_work_timer_hooks_only_near_the_loss_and_keeps_one_once_a_step_is_timed(tmp_path):
    torch = pytest.importorskip("torch")
    from smartlaunch.launch.worktime import CANDIDATES
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(12)])   # 24 tensors
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    timer, rec = _timed_steps(tmp_path, model, opt, [torch.randn(2, 4)] * 6,
                              lambda m, x: m(x).sum())
    assert rec.steps == 5 and len(timer._handles) == 1
    # the one kept is the first gradient of backward: the last layer's
    kept = next(iter(timer._handles))
    assert kept in (id(model[11].weight), id(model[11].bias))
    # a hooked tensor keeps costing a call per step after its hook is removed: only the first
    # and last CANDIDATES / 2 were ever hooked
    params = list(model.parameters())
    half = CANDIDATES // 2
    assert [p._post_accumulate_grad_hooks is None for p in params] == \
        [False] * half + [True] * (len(params) - 2 * half) + [False] * half


def test_work_timer_keeps_the_first_gradient_of_a_model_that_defines_its_head_first(tmp_path):
    torch = pytest.importorskip("torch")

    class HeadFirst(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(4, 1)
            self.body = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(8)])

        def forward(self, x):
            return self.head(self.body(x))

    model = HeadFirst()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    timer, rec = _timed_steps(tmp_path, model, opt, [torch.randn(2, 4)] * 6,
                              lambda m, x: m(x).sum())
    assert rec.steps == 5
    assert next(iter(timer._handles)) in (id(model.head.weight), id(model.head.bias))


def test_work_timer_hooks_all_again_when_the_kept_one_sees_no_gradient(tmp_path):
    torch = pytest.importorskip("torch")
    a, b = torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)
    model = torch.nn.ModuleList([a, b])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(2, 4)
    # three steps through a, then four through b only: a's hook is the one kept, then useless
    timer, rec = _timed_steps(tmp_path, model, opt, [("a", x)] * 3 + [("b", x)] * 4,
                              lambda m, xx: (a if xx[0] == "a" else b)(xx[1]).sum())
    assert len(timer._handles) == 4 and not timer._trim
    assert rec.steps == 5       # 2 through a; the first step through b is lost; 3 through b


def test_work_timer_times_a_step_at_most_every_so_often(tmp_path):
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(3)])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # fast steps (no pause): far fewer timed than run
    timer, rec = _timed_steps(tmp_path, model, opt, [torch.randn(2, 4)] * 200,
                              lambda m, x: m(x).sum(), every_s=3600)
    assert timer._steps == 200 and rec.steps == 1
    # steps slower than every_s: every one after the first is timed
    timer, rec = _timed_steps(tmp_path, model, opt, [torch.randn(2, 4)] * 6,
                              lambda m, x: m(x).sum(), every_s=0.01, pause=0.02)
    assert rec.steps == 5 and 0.02 <= rec.work_s / rec.steps < 1.0


# ---- Flight Recorder ----------------------------------------------------------------------
def test_recorder_paths_go_to_the_run_dir(tmp_path):
    add, fr = flightrec.recorder_env({}, str(tmp_path))
    folder = str(tmp_path / "flight-recorder")
    assert add == {"TORCH_FR_DUMP_TEMP_FILE": f"{folder}/rank", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"{folder}/pipe",
                   "TORCH_FR_BUFFER_SIZE": "2000"}
    assert os.path.isdir(folder) and fr.pipe(1) == f"{folder}/pipe1.pipe"
    assert fr.dumps(1) == [f"{folder}/rank1", "/tmp/nccl_trace_rank_1"]


def test_recorder_keeps_what_the_user_set(tmp_path):
    user = {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/u/dump_", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/u/p_",
            "TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}
    add, fr = flightrec.recorder_env(user, str(tmp_path))
    assert add == {}
    assert fr.pipe(0) == "/u/p_0.pipe" and fr.dumps(0)[0] == "/u/dump_0"


def _entry(seq, state, op="nccl:all_reduce", sizes=((1024,),)):
    return {"pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": seq, "p2p_seq_id": 0,
            "profiling_name": op, "state": state, "input_sizes": [list(s) for s in sizes]}


def test_explain_names_the_rank_that_did_not_enter():
    r0 = {"entries": [_entry(599, "completed"), _entry(600, "scheduled", sizes=((1,),))]}
    r1 = {"entries": [_entry(598, "completed"), _entry(599, "completed")]}
    assert flightrec.verdict({0: r0, 1: r1}, [0, 1])[0] == [
        "rank 1 did not enter collective #600 (nccl:all_reduce, process group 0); its last was #599, "
        "the other ranks entered #600"]


def test_explain_all_entered_none_finished_and_mismatch():
    r0 = {"entries": [_entry(7, "started", sizes=((1,),))]}
    r1 = {"entries": [_entry(7, "started", sizes=((1024,),))]}
    lines = flightrec.verdict({0: r0, 1: r1, 2: None}, [0, 1, 2])[0]
    assert lines[0].startswith("no Flight Recorder dump from rank 2")
    assert "ranks called different operations as collective #7" in lines[1]
    assert lines[2] == "all ranks entered collective #7 (nccl:all_reduce, process group 0); ranks 0, 1 did not finish it"


def test_dump_read_refuses_objects(tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.write_bytes(pickle.dumps({"version": "2.10", "entries": [_entry(1, "completed")]}))
    bad.write_bytes(pickle.dumps({"x": threading.Lock}))
    assert flightrec.read_dump(str(good))["entries"][0]["collective_seq_id"] == 1
    assert flightrec.read_dump(str(bad)) is None


def test_a_dump_that_another_user_could_have_planted_is_not_read(tmp_path, monkeypatch):
    # torch's default dump path is the shared /tmp: only this user's regular files, whole
    # and under the cap, are read; a FIFO there must not block the launcher's hang report.
    data = pickle.dumps({"entries": [_entry(1, "completed")]})
    mine, link, fifo, big, theirs = (tmp_path / n for n in ("mine", "link", "fifo", "big",
                                                            "theirs"))
    mine.write_bytes(data)
    link.symlink_to(mine)
    os.mkfifo(fifo)
    big.write_bytes(data)
    theirs.write_bytes(data)
    if os.getuid() == 0:           # CI's; elsewhere the owner check is not exercised here
        os.chown(theirs, 65534, 65534)
    monkeypatch.setattr(flightrec, "MAX_DUMP_BYTES", len(data) - 1)
    assert [flightrec.read_dump(str(p)) for p in (mine, link, fifo, big)] == [None] * 4
    monkeypatch.setattr(flightrec, "MAX_DUMP_BYTES", len(data))
    assert flightrec.read_dump(str(mine))["entries"][0]["collective_seq_id"] == 1
    assert flightrec.read_dump(str(link)) is None and flightrec.read_dump(str(fifo)) is None
    if os.getuid() == 0:
        assert flightrec.read_dump(str(theirs)) is None
        fr = flightrec.FlightRecorder(None, (str(tmp_path / "none_"), str(tmp_path / "t")))
        (tmp_path / "t0").write_bytes(data)
        os.chown(tmp_path / "t0", 65534, 65534)
        assert flightrec.collect(fr, [(0, time.time())], wait_s=0.5) == {}


def test_ask_and_collect_through_a_real_pipe(tmp_path):
    _, fr = flightrec.recorder_env({}, str(tmp_path))
    os.mkfifo(fr.pipe(0))
    fd = os.open(fr.pipe(0), os.O_RDONLY | os.O_NONBLOCK)     # torch's heartbeat thread, here

    def rank0():
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                if os.read(fd, 10):
                    with open(fr.dumps(0)[0], "wb") as f:
                        pickle.dump({"entries": [_entry(3, "completed")]}, f)
                    return
            except BlockingIOError:
                pass
            time.sleep(0.05)
    t = threading.Thread(target=rank0)
    t.start()
    asked = flightrec.ask(fr, [0, 1])               # rank 1 has no pipe: skipped
    got = flightrec.collect(fr, asked, wait_s=5)
    t.join()
    os.close(fd)
    assert [r for r, _ in asked] == [0] and got == {0: fr.dumps(0)[0]}


# ---- recorded on the 2x H200 (bench/diag/run_gpu.sh), replayed here --------------------------
DATA = os.path.join(os.path.dirname(__file__), "data")


def _replay(name):
    import json
    rows = [GpuSample.from_dict(json.loads(line)) for line in open(os.path.join(DATA, name))]
    by_t: dict = {}
    for s in rows:
        by_t.setdefault(s.t, []).append(s)
    return [by_t[t] for t in sorted(by_t)]


@pytest.mark.parametrize("name, warned", [("gpu-samples-h200-recorded.jsonl", False),
                                          ("gpu-samples-h200-throttled.jsonl", True)])
def test_recorded_nvml_samples_replayed_for_drift(name, warned):
    """Real samples of a 30 s DDP run (both GPUs at 1,980 MHz under load) stay silent; the
    same recording with GPU1 held at 1,410 MHz from mid-run (bench/diag/throttle_fixture.py: no
    lent GPU may be made to throttle) gives one warning with its numbers."""
    frames = iter(_replay(name))
    mon = RunMonitor(LaunchPolicy(gpu_sample_s=0.0), sample_gpus=lambda: next(frames, []))
    for i in range(len(_replay(name))):
        mon.observe(float(i), {})
    if not warned:
        assert mon.warnings == []
        return
    assert len(mon.warnings) == 1
    assert mon.warnings[0].startswith("smartlaunch: warning: GPU1 clock fell from 1,980 to 1,410 MHz (-29%) "
                                      "under the same load over 0.")
    assert mon.warnings[0].endswith("thermal slowdown.")


def test_throttled_fixture_names_the_cause_of_a_slow_rank():
    last = _replay("gpu-samples-h200-throttled.jsonl")[-1]
    st = Straggler(1, 1, 0.0124, 0.0099, 0.0131, 10, "CUDA events", gpu=1)
    text = straggler_text(st, next(s for s in last if s.gpu == 1), [s for s in last if s.gpu == 0])
    assert "GPU1 holds 1,410 of 1,980 MHz (others 1,980 MHz): thermal slowdown; 81 C" in text


def test_recorded_flight_recorder_dumps_of_a_skipped_all_reduce():
    """torch 2.11's own dumps (pickle, version 2.10) from the H200 run of
    bench/diag/skip_allreduce.py: rank 1 skipped the loss all-reduce at step 200."""
    dumps = {r: flightrec.read_dump(os.path.join(DATA, f"fr-skip-allreduce-h200-rank{r}")) for r in (0, 1)}
    assert dumps[0]["version"] == "2.10"
    assert flightrec.verdict(dumps, [0, 1]) == (
        ["rank 1 did not enter collective #600 (nccl:all_reduce, process group 0); its last was #599, "
         "the other ranks entered #600"], [1])


def test_trend_ignores_the_flat_tail_after_the_last_step():
    hist = [(float(t), 75 * t) for t in range(31)] + [(30.0 + t, 75 * 30) for t in range(1, 12)]
    first, last = rate_trend(hist)
    assert first == pytest.approx(75.0) and last == pytest.approx(75.0)
    assert rate_trend([(0.0, 1), (1.0, 200)]) is None          # a 1 s run says nothing
