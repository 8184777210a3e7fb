"""`python -m bench ...` (from the repository root): bench/run.py's command line."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import main  # noqa: E402

sys.exit(main())
