"""Names of catalog models: catalog ids, the Hugging Face repositories an entry lists (``hf_ids``), those
repositories' names without their organisation, Ollama tags and chat-tuned suffixes (:func:`resolve_model_id`)."""
from __future__ import annotations

import re

from .. import _catalog
from ..errors import MoesimError


_HF_INDEX: dict = {}     # "index": the alias table, built on first use


def _hf_alias_index() -> dict:
    """Lower-cased Hugging Face repo id -> catalog id, from every entry's ``hf_ids`` (built once).

    An alias that two entries claim, or that shadows a catalog id, is a catalog bug: refuse it."""
    index = _HF_INDEX.get("index")
    if index is not None:
        return index
    entries = _catalog.load("models")["models"]
    index = {}
    for mid, entry in entries.items():
        aliases = entry.get("hf_ids", [])
        if not isinstance(aliases, list) or not all(isinstance(a, str) and "/" in a for a in aliases):
            raise MoesimError(f"catalog entry {mid!r}: hf_ids must be a list of 'org/name' strings", "hf_ids")
        for alias in aliases:
            key = alias.strip().lower()
            if key in index or key in entries:
                raise MoesimError(f"catalog entry {mid!r}: hf id {alias!r} is already taken by "
                                  f"{index.get(key, key)!r}", "hf_ids")
            index[key] = mid
    _HF_INDEX["index"] = index
    return index


def resolve_model_id(text: str) -> str | None:
    """The catalog id that *text* names, case-insensitively: a catalog id, a Hugging Face repo id listed in
    an entry's ``hf_ids``, or such a repo's name without its organisation (``Qwen3-30B-A3B-Instruct-2507``);
    an Ollama tag (``gpt-oss:20b``) or a chat-tuned name (``llama-3-8b-instruct``) names the id it
    differs from only by that spelling or suffix (the same architecture). None when it names none."""
    key = text.strip().lower().replace(":", "-")
    entries = _catalog.load("models")["models"]
    for candidate in (key, _TUNED_SUFFIX.sub(r"\1", key)):
        if candidate in entries:
            return candidate
        mid = _hf_alias_index().get(candidate) or _hf_repo_name_index().get(candidate)
        if mid is not None:
            return mid
    return None


# a chat- or instruction-tuned release's suffix, before an optional date tag (-2507): the base model's numbers
_TUNED_SUFFIX = re.compile(r"-(?:instruct|chat|it|base)(-\d{4})?$")


def _hf_repo_name_index() -> dict:
    """Lower-cased repo name without its organisation -> catalog id, for names only one entry lists."""
    index = _HF_INDEX.get("names")
    if index is None:
        seen: dict = {}
        for alias, mid in _hf_alias_index().items():
            seen.setdefault(alias.split("/", 1)[1], set()).add(mid)
        entries = _catalog.load("models")["models"]
        index = {k: next(iter(v)) for k, v in seen.items() if len(v) == 1 and k not in entries}
        _HF_INDEX["names"] = index
    return index
