"""Makes ``palisade.py`` (one directory up), and the tests' shared helpers in
``test_client.py`` and ``palisade_binary.py``, importable however pytest is started."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
