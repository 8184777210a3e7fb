"""`--explain` as text: what will run, then every number the decision used, then why."""
from __future__ import annotations

from smartlaunch.decide.api import Units
from smartlaunch.decide.batch import global_batch
from smartlaunch.decide.plan import Candidate, CommSummary, Plan, strategy_name
from smartlaunch.decide.select import SUPERLINEAR, interval
from smartlaunch.decide.words import gbps, gpu_list, mb, ms, pct, rate, size, times, us
from smartlaunch.profile.api import ModelProfile, ProfileStatus
from smartlaunch.vocab import format_ranges


def render_text(plan: Plan, units: Units) -> str:
    lines = [_headline(plan, units)]
    lines += [b for b in [global_batch(plan, units)] if b]
    lines += _profile(plan.profile)
    lines += _comm(plan.comm)
    t = plan.topology
    if t:
        lines.append(f"topology: {t.get('source', '??')}, fingerprint {t.get('fingerprint', '??')}"
                     + (f" ({t['note']})" if t.get("note") else ""))
    if plan.candidates:
        lines.append("")
        lines += _table(plan.candidates, units)
        lines.append("")
        lines.append("why each candidate won or lost:")
        lines += [f"  - {c.reason}" for c in plan.candidates if c.reason]
    lines.append("")
    lines.append("reasons:")
    lines += [f"  - {r.text}" + (f"  [{r.rule}]" if r.rule else "") for r in plan.reasons] \
        or ["  (none)"]
    lines += units[plan.strategy].placement_lines(plan)
    lines.append("environment added to workers:")
    lines += [f"  {e.name}={e.value}  ({e.source})" for e in plan.env] or ["  (nothing)"]
    lines.append("NUMA binding:")
    lines += _numa(plan, units)
    if plan.variants:
        lines.append(f"variants ({len(plan.variants)}):")
        lines += [f"  {i}: {' '.join(v)}" for i, v in enumerate(plan.variants)]
    if plan.node_variants:
        lines.append(f"variants by node ({len(plan.node_variants)} nodes):")
        lines += [f"  node {k}: " + (f"variant{'s' if len(s) > 1 else ''} {format_ranges(s)}"
                                     if s else "none (the node exits 0)")
                  + (" ← this node" if k == plan.node_index else "")
                  for k, s in enumerate(plan.node_variants)]
    if plan.timings:
        lines.append(_timings(plan.timings))
    return "\n".join(lines) + "\n"


def placement(plan: Plan, moves: bool = False) -> list[str]:
    """GPUs left free and lease behaviour; moves: the job may move to plan.fallback_gpus."""
    if plan.device != "cuda":
        return []
    lines = [f"GPUs left free: {gpu_list(plan.left_free)}"]
    if moves:
        lines.append(f"fallback GPUs (if {gpu_list(plan.gpus)} is taken before the lease): "
                     f"{gpu_list(plan.fallback_gpus)}")
    why = f" ({plan.wait_reason})" if plan.wait_reason else ""
    lines.append(f"leases: waits up to {plan.wait_timeout_s:g} s for its GPUs"
                 + (why or " if another launch holds them") if plan.wait_for_lease else
                 "leases: --no-wait: fails at once, naming the holders, if another launch holds "
                 f"its GPUs{why}")
    return lines


def rank_binding(b) -> str:
    return f"local rank {b.local_rank} → GPU{b.gpu}"


def _bound(plan: Plan, b, units: Units) -> str:
    if b.gpu in plan.fallback_gpus:
        return f"if moved to GPU{b.gpu}"
    return units[plan.strategy].binding_label(b)


def _numa(plan: Plan, units: Units) -> list[str]:
    """One line per binding; a note every binding shares is said once."""
    if not plan.numa:
        return ["  (none)"]
    notes = [_notes(b.note) for b in plan.numa]
    shared = [n for n in notes[0] if all(n in other for other in notes[1:])] \
        if len(plan.numa) > 1 else []
    out = []
    for b, own in zip(plan.numa, notes):
        note = "; ".join(n for n in own if n not in shared)
        if b.mechanism == "none":
            where = f"NUMA node {b.numa_node}, not pinned" if b.numa_node >= 0 else "not pinned"
        else:
            where = f"NUMA node {b.numa_node}, CPUs {cpu_ranges(b.cpus)} ({b.mode} via {b.mechanism})"
        out.append(f"  {_bound(plan, b, units)}, {where}" + (f": {note}" if note else ""))
    out += [f"  every binding: {n}" for n in shared]
    return out


def _notes(note: str) -> list[str]:
    return [n for n in note.split("; ") if n]


def _headline(plan: Plan, units: Units) -> str:
    what = units[plan.strategy].headline(plan)
    extra = f"nproc-per-node {plan.nproc_per_node}, nnodes {plan.nnodes}, device {plan.device}, " \
            f"up to {plan.requested_max} allowed"
    return f"smartlaunch: {what} [{extra}]" + (" (strategy forced)" if plan.forced else "")


def _profile(p: ModelProfile | None) -> list[str]:
    if p is None:
        return ["profile: none"]
    if p.status not in (ProfileStatus.OK, ProfileStatus.INCOMPLETE):
        note = f": {p.note}" if p.note else ""
        cached = " (cached; --reprofile measures again)" if p.cached else ""
        return [f"profile: {p.status.value}{cached}{note}"]
    params = p.trainable_params or p.total_params or 0
    step, p90, bwd = p.step_time_s, p.step_time_p90_s, p.backward_s
    micro, per = p.micro_batches, p.micro_batch_size
    batch_txt = f"batch {p.batch_size if p.batch_size is not None else '??'}"
    if micro and micro > 1:
        batch_txt += f" per step ({micro} micro-batches of {per if per is not None else '??'})"
    parts = [f"{params / 1e6:.1f}M params", f"{mb(p.grad_bytes)} grads", batch_txt,
             f"step {ms(step)}" + (f" (p90 {ms(p90)})" if p90 else "")]
    if bwd and step:
        parts.append(f"backward {pct(bwd / step)} of the step")
    if p.host_slack_s is not None and step and p.device.startswith("cuda"):
        parts.append(f"host {ms(p.host_slack_s)} ahead of the GPU")
    if p.peak_gpu_mem_bytes:
        parts.append(f"peak {p.peak_gpu_mem_bytes / 1024 ** 3:.1f} GiB")
    parts.append("cached" if p.cached else
                 (f"dry run {p.dry_run_s:.1f} s" if p.dry_run_s is not None else "dry run ??"))
    timing = f", {p.timing}" if p.timing else ""
    out = ["profile: " + ", ".join(parts) +
           f" [{p.status.value}, {p.steps_measured} steps{timing}]"]
    if p.note:
        out.append(f"  note: {p.note}")
    if p.window_cut_short:
        out.append(f"  confidence: low: the script ended before the measurement window was "
                   f"complete ({p.steps_measured} steps)")
    if p.reads_world_size:
        out.append(world_size_sentence(p))
    return out


def world_size_sentence(p: ModelProfile) -> str:
    work = f"{p.batch_size} samples" if p.batch_size else "the profiled work"
    head = (f"  per-rank work: the script's own code asks for the world size before its first "
            f"step ({p.reads_world_size}); predictions assume torchrun's semantics, each "
            f"rank doing the profiled single-GPU step ({work})")
    if (p.micro_batches or 1) > 1:
        return (head + f", but with {p.micro_batches} accumulated micro-batches it may "
                f"divide its accumulation by the number of ranks (as nanoGPT does); a measured "
                f"trial settles it")
    return head


def _comm(c: CommSummary | None) -> list[str]:
    if c is None:
        return ["all-reduce: not measured"]
    how = f"derived from {gpu_list(c.derived_from)}'s {'cached' if c.cached else 'measured'}" \
        f" curve" if c.derived_from else "cached" if c.cached else "measured"
    head = f"all-reduce ({c.backend}, {gpu_list(c.gpus or ())}, {how})"
    if not c.points:
        return [f"{head}: no measured sizes"]
    (lo, t_lo), hi = c.points[0], c.points[-1][0]
    if c.busbw_256MiB_GBps is not None:
        parts = [f"busbw {gbps(c.busbw_256MiB_GBps * 1e9)} at 256 MiB"]
    elif c.busbw_largest_GBps is not None:
        parts = [f"busbw {gbps(c.busbw_largest_GBps * 1e9)} at {size(hi)}, the largest measured"]
    else:
        parts = []
    if c.busbw_at_grad_GBps is not None:
        parts.append(f"{gbps(c.busbw_at_grad_GBps * 1e9)} at the gradient size")
    elif c.grad_bytes:
        side = f"below the smallest measured, {size(lo)}" if c.grad_bytes < lo else \
            f"above the largest measured, {size(hi)}"
        parts.append(f"no figure at the gradient size ({size(c.grad_bytes)}, {side})")
    parts.append(f"latency {c.latency_us:.0f} µs" if c.latency_us is not None else
                 f"{us(t_lo)} for {size(lo)}, the smallest measured size")
    return [f"{head}: " + ", ".join(parts)]


def _table(cands: tuple[Candidate, ...], units: Units) -> list[str]:
    head = ("", "candidate", "GPUs", "step", "samples/s", "speedup", "eff", "all-reduce", "from")
    rows = [head]
    for c in cands:
        name = units[c.strategy].table_name(c)
        rows.append(("*" if c.chosen else "", name, ",".join(map(str, c.gpus)) or "-",
                     ms(c.predicted_step_s) if c.predicted_step_s else "-",
                     rate(c.predicted_samples_per_s).split()[0] if c.predicted_samples_per_s
                     else "-",
                     times(c.speedup) if c.speedup is not None else "-",
                     pct(c.efficiency) if c.efficiency is not None else "-",
                     ms(c.allreduce_s) if c.allreduce_s else "-",
                     "measured" if c.measured else "corrected" if c.corrected else
                     ("predicted" if c.speedup is not None else "-")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return ["  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]


def cpu_ranges(cpus) -> str:
    return format_ranges(cpus) or "none"


TIMED_STAGES = ("policy", "topology", "leases", "profile", "allreduce", "trials", "decide")
TRIAL_PHASES = (("start", "start-up {:.2f}"), ("setup", "script set-up {:.2f}"),
                ("steps", "steps {:.2f}"), ("exit", "exit {:.2f}"),
                ("killed", "killed at the time limit after {:.2f} s"))
STAGE_NOTES = {"profile": ("profile_gate", "waited {:.2f} at its gate for the all-reduce sweep"),
               "allreduce": ("allreduce_early", "swept during the dry run in {:.2f}")}


def _timings(t: dict) -> str:
    def note(k: str) -> str:
        if k == "trials":
            return _trial_split(t)
        key, text = STAGE_NOTES.get(k, ("", ""))
        return f" [{text.format(t[key])}]" if key in t else ""
    parts = ", ".join(f"{k} {t.get(k, 0):.2f}{note(k)}" for k in TIMED_STAGES
                      if t.get(k, 0) >= 0.005 or note(k))
    head = f"decided in {t.get('total', 0):.2f} s" + (f" ({parts})" if parts else "")
    if t.get("since_process_start") is not None:
        head += f"; {t['since_process_start']:.2f} s since the command started (Python, torch import)"
    return head


def _trial_split(t: dict) -> str:
    parts = [text.format(t[f"trials_{k}"]) for k, text in TRIAL_PHASES if f"trials_{k}" in t]
    return f" [{', '.join(parts)}]" if parts else ""


def decision_line(plan: Plan, units: Units, floor: float | None = None) -> str:
    """The line every launch prints before the job's output: what runs, where, and the
    number that decided it; floor: decision.min_efficiency."""
    what = units[plan.strategy].line(plan)
    chosen = next((c for c in plan.candidates if c.chosen), None)
    rival = next((c for c in plan.candidates if not c.chosen and c.speedup is not None
                  and units[c.strategy].COLLECTIVE), None)
    if plan.node_variants:
        why = (f"a sweep split over {len(plan.node_variants)} nodes, one plan for every node, "
               f"no process group between them")
    elif plan.multi_node:
        why = (f"multi-node job on {plan.nnodes} node(s): launched as torchrun would, one "
               f"plan for every node")
    elif plan.forced:
        why = f"forced by --strategy {strategy_name(plan.strategy)}"
    elif plan.groups and chosen is not None and chosen.speedup is not None:
        why = (f"{'measured' if chosen.measured else 'predicted'} {times(chosen.speedup)} one "
               f"GPU's samples/s in all")
    elif units[plan.strategy].COLLECTIVE and chosen is not None and chosen.speedup is not None:
        why = f"{'measured' if chosen.measured else 'predicted'} {times(chosen.speedup)} one GPU" \
            + (", as trials of other sizes corrected it" if chosen.corrected else "") \
            + _draws(chosen)
        if chosen.measured and chosen.speedup > len(chosen.gpus) * SUPERLINEAR:
            why += f" (superlinear on {len(chosen.gpus)} GPUs: --explain says why)"
    elif rival is not None:
        why = (f"{units[rival.strategy].short_name(rival)} "
               f"{'measured' if rival.measured else 'predicted'} "
               f"{times(rival.speedup)} one GPU" + _against_floor(rival, floor))
    elif plan.device != "cuda":
        why = "no GPU visible"
    else:
        why = ""
    batch = global_batch(plan, units)
    return f"{what}{' — ' + why if why else ''}{'; ' + batch if batch else ''}; --explain for why"


def _draws(c: Candidate, then: str = "") -> str:
    """' (mean of 3 trials: 69% ± 8%)'; then: what follows inside the brackets."""
    if c.draws < 2 or c.efficiency is None:
        return ""
    return f" (mean of {c.draws} trials: {pct(c.efficiency)} ± {pct(interval(c.draws))}{then})"


def _against_floor(c: Candidate, floor: float | None) -> str:
    """' (58%, below the policy's 70%)', or its efficiency alone where not below."""
    if c.efficiency is None:
        return ""
    below = floor is not None and c.efficiency < floor
    if c.draws > 1:
        return _draws(c, f", below the policy's {pct(floor)}" if below else "")
    if not below:
        return f" ({pct(c.efficiency)} efficiency)"
    eff = pct(c.efficiency)
    if eff == pct(floor):       # 69.6% is not "70%, below the policy's 70%"
        eff = f"{c.efficiency * 100:.1f}%"
    return f" ({eff}, below the policy's {pct(floor)})"
