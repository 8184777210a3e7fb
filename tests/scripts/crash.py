"""Fails before training, as a script with a bad configuration does."""
import sys

print("loading config", flush=True)
print("error: learning rate must be positive (got -0.1)", file=sys.stderr)
sys.exit(3)
