#!/usr/bin/env python3
"""Write fake model revisions (deterministic random bytes) for the ocr_model scenario.

OUT/rev-a, rev-b, rev-c: good revisions; bad-b: rev-b with model.safetensors corrupted in place
(same size) and a nested file truncated; missing-b: rev-b without tokenizer.json.
"""

import random
import shutil
import sys
from pathlib import Path


def revision(root: Path, seed: int, mib: int) -> None:
    rnd = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(f'{{"model_type": "fake", "seed": {seed}}}\n')
    (root / "tokenizer.json").write_text(f'{{"vocab": {{"a": {rnd.randrange(1000)}}}}}\n')
    (root / "model.safetensors").write_bytes(rnd.randbytes(mib * 1024 * 1024))
    (root / "processor").mkdir(exist_ok=True)
    (root / "processor" / "preprocessor_config.json").write_text(f'{{"size": {seed * 1000 + 1}}}\n')


def main(out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    revision(out / "rev-a", 1, 4)
    revision(out / "rev-b", 2, 6)
    revision(out / "rev-c", 3, 3)
    shutil.copytree(out / "rev-b", out / "bad-b")
    with open(out / "bad-b" / "model.safetensors", "r+b") as f:
        f.seek(4096)
        byte = f.read(1)
        f.seek(4096)
        f.write(bytes([byte[0] ^ 0xFF]))
    nested = out / "bad-b" / "processor" / "preprocessor_config.json"
    nested.write_text(nested.read_text()[:-3])
    shutil.copytree(out / "rev-b", out / "missing-b")
    (out / "missing-b" / "tokenizer.json").unlink()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
