"""Running npudoctor's CLI where torch is not installed (a slim CI image): importing it fails the way
a missing package does, so the live depth is unavailable."""

from __future__ import annotations

WITHOUT_TORCH = """
import sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoTorch())
from npudoctor.cli import main
sys.exit(main(sys.argv[1:]))
"""
