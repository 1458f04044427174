import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
# One thread per rank process: tests run several gloo ranks on a 2-core machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")
