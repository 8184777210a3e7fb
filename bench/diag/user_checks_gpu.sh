#!/usr/bin/env bash
# One device call: what a user of torchrun's options expects, on a real GPU, under smartlaunch and
# torchrun side by side. (1) a single process run through torch's agent: --tee, --log-dir and
# --max-restarts (the first attempt fails, the restart succeeds); (2) a CUDA job that checkpoints
# for 12 s on SIGTERM (preemption) keeps its checkpoint. Results under $OUT/checks.
set -u
. "$(dirname "$0")/device_setup.sh"
res="$OUT/checks"; w="$(mktemp -d)"; mkdir -p "$res"
cat > "$w/fail_once.py" <<'PY'
import os, torch
x = torch.ones(1024, device="cuda").sum().item()
n = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(f"attempt {n} on {torch.cuda.get_device_name()} sum={x}", flush=True)
if n == 0:
    raise SystemExit("first attempt fails on purpose")
PY
cat > "$w/ckpt_train.py" <<'PY'
import os, signal, sys, time, torch
stop = []
signal.signal(signal.SIGTERM, lambda s, f: stop.append(s))
m = torch.nn.Linear(512, 512).cuda(); opt = torch.optim.SGD(m.parameters(), lr=0.01)
step = 0
while True:
    loss = m(torch.randn(256, 512, device="cuda")).square().mean()
    opt.zero_grad(); loss.backward(); opt.step(); step += 1
    if step == 20:
        print("ready", flush=True)
    if stop:
        time.sleep(12)                     # a slow checkpoint write
        torch.save(m.state_dict(), f"{sys.argv[1]}-{os.environ.get('RANK', '0')}.pt")
        sys.exit(0)
PY
cd "$w"
for who in smartlaunch torchrun; do
    rm -rf "$w/logs-$who"
    $who --tee 3 --max-restarts 1 --log-dir "$w/logs-$who" fail_once.py > "$res/restart-$who.out" 2>&1
    echo "restart $who exit=$?" | tee -a "$res/summary.txt"
    find "$w/logs-$who" -type f | sed "s|$w/||" | sort >> "$res/restart-$who.out"
done
for who in "smartlaunch" "smartlaunch --strategy ddp --nproc-per-node 1" "torchrun --nproc-per-node 1"; do
    tag=$(echo "$who" | tr ' ' '_'); rm -f "$w"/ckpt-*
    t0=$(date +%s.%N)
    coproc P { exec $who ckpt_train.py "$w/ckpt" 2>"$res/ckpt-$tag.err"; }
    pid=$P_PID; read -r -t 120 line <&"${P[0]}"
    before=$(ls "$w"/ckpt-* 2>/dev/null | xargs -n1 basename 2>/dev/null | tr '\n' ' ')
    kill -TERM "$pid"; wait "$pid"; rc=$?
    t1=$(date +%s.%N)
    echo "sigterm '$who': first line '$line' exit=$rc after $(python3 -c "print(round($t1-$t0,1))") s total, before SIGTERM: [$before], saved: $(ls "$w"/ckpt-* 2>/dev/null | xargs -n1 basename 2>/dev/null | tr '\n' ' ')" | tee -a "$res/summary.txt"
done
