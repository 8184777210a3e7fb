"""Copy stdin to stdout with seconds since this process started in front of each line."""
import sys
import time

t0 = time.monotonic()
for line in sys.stdin:
    sys.stdout.write(f"[{time.monotonic() - t0:7.2f}] {line}")
    sys.stdout.flush()
