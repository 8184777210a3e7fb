"""`python -m smartlaunch.scheduler`: the detected Slurm context as JSON (tests, debugging)."""
import sys

from smartlaunch.scheduler.slurm import main

sys.exit(main())
