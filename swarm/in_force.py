"""What the live run had in force when the controller changed it, read from the `pre-<id>`
checkpoint the controller asks for just before applying an intervention: the trainer saves its
live recipe and harness there, whatever changed them behind the controller's back (a departure
finding says the live config left what the controller set, not which field).

    before = values_before(run_dir / "checkpoints" / "pre-ab12cd34.pt", ["harness.sampling.max_new_tokens"])
    # {"harness.sampling.max_new_tokens": 8}

The controller records it as the intervention's `outcome["before"]`; the skill miner keys a skill
by the fields whose value the change actually moved (agents/miner.py).

Only the checkpoint's pickled object tree (`<archive>/data.pkl`) is read, by a restricted
unpickler: nothing the file names is imported or called (each class or function becomes an inert
placeholder) and no tensor is loaded. The recipe and harness are plain JSON data (the trainer
dumps them so). Anything unreadable gives {}: what was in force is then not known.
"""
from __future__ import annotations

import collections
import pathlib
import pickle
import zipfile
from typing import Any

from trainer.config import get_dotted

MAX_PICKLE_BYTES = 64 << 20    # the object tree without tensors: a small model's is a few hundred KB


class _Opaque:
    """What every global the pickle names becomes: accepts any construction and state, does nothing."""

    def __new__(cls, *a: Any, **k: Any) -> "_Opaque":
        return object.__new__(cls)

    def __init__(self, *a: Any, **k: Any) -> None:
        pass

    def __call__(self, *a: Any, **k: Any) -> "_Opaque":
        return _Opaque()

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, value: Any) -> None:
        pass

    def extend(self, values: Any) -> None:
        pass


class _DataOnly(pickle.Unpickler):
    SAFE = {("collections", "OrderedDict"): collections.OrderedDict}

    def find_class(self, module: str, name: str) -> Any:
        return self.SAFE.get((module, name), _Opaque)

    def persistent_load(self, pid: Any) -> None:   # tensor storages: not loaded
        return None


def config_at(path: str | pathlib.Path) -> dict[str, dict[str, Any]]:
    """{"recipe": …, "harness": …} as saved in a trainer checkpoint; {} when unreadable."""
    try:
        with zipfile.ZipFile(path) as z:
            name = next((n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl"), None)
            if name is None or z.getinfo(name).file_size > MAX_PICKLE_BYTES:
                return {}
            st = _DataOnly(z.open(name)).load()
    except Exception:   # a boundary: a missing, torn or foreign file means "not known", never a failed apply
        return {}
    if not isinstance(st, dict):
        return {}
    return {k: st[k] for k in ("recipe", "harness") if isinstance(st.get(k), dict)}


def values_before(path: str | pathlib.Path, keys: list[str]) -> dict[str, Any]:
    """The dotted fields' values in the checkpoint at `path` (those it holds)."""
    cfg = config_at(path)
    out = {}
    for k in keys:
        found, v = get_dotted(cfg, k)
        if found:
            out[k] = v
    return out
