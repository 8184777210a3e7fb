"""Derive a clock-limited fixture from a recorded gpu-samples.jsonl (issue 18).

A lent machine's GPU settings are never changed, so no GPU could be made to throttle; this
takes real NVML samples recorded under load and, from the middle of the run on, holds one GPU's
SM clock at --mhz with the throttle reason NVML reports for a thermal slowdown, its temperature
raised by --hotter. Everything else (times, the other GPU, power, utilisation) stays as recorded.

    python bench/diag/throttle_fixture.py RECORDED.jsonl OUT.jsonl --gpu 1 --mhz 1410
"""
import argparse
import json

p = argparse.ArgumentParser()
p.add_argument("recorded")
p.add_argument("out")
p.add_argument("--gpu", type=int, default=1)
p.add_argument("--mhz", type=int, default=1410)
p.add_argument("--hotter", type=int, default=20)
a = p.parse_args()
rows = [json.loads(line) for line in open(a.recorded) if line.strip()]
t_mid = sorted(r["t"] for r in rows)[len(rows) // 2]
with open(a.out, "w") as f:
    for r in rows:
        if r["gpu"] == a.gpu and r["t"] >= t_mid:
            r = {**r, "sm_clock_mhz": a.mhz, "throttle_reasons": ["sw_thermal_slowdown"],
                 "temperature_c": (r["temperature_c"] or 60) + a.hotter}
        f.write(json.dumps(r, sort_keys=True) + "\n")
print(f"{len(rows)} samples, GPU{a.gpu} held at {a.mhz} MHz from t={t_mid:.1f}")
