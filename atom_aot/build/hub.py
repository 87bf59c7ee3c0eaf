"""Hugging Face Hub ids as `--model`: `ORG/NAME` or `ORG/NAME@REVISION`, resolved through
huggingface_hub to a snapshot folder in the HF cache (downloaded when the Hub is reachable and
`HF_HUB_OFFLINE` is not set). The build reads the folder like any other; the build key hashes the
snapshot's content, never the id, so the same weights give the same artifact by id or by path."""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("atom_aot")

# Hub repo ids: letters, digits, '-', '_', '.'; one '/'; an optional '@revision' (branch, tag or commit).
_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96})(?:@(?P<revision>[\w./-]{1,128}))?$")

# What a build reads from a model repo: configs, weights, tokenizer, chat template. `weights=False`
# (random-weight builds) leaves the weight files on the Hub.
_CONFIG_PATTERNS = ["*.json", "tokenizer.model", "*.jinja", "merges.txt", "vocab.txt"]
_WEIGHT_PATTERNS = ["*.safetensors"]


@dataclass(frozen=True)
class HubId:
    repo: str                    # ORG/NAME
    revision: str | None         # None: the default branch

    @property
    def name(self) -> str:
        """The short name an artifact file is named after."""
        return self.repo.split("/", 1)[1]


def parse_hub_id(model: str) -> HubId | None:
    """The id `model` names, or None when it is not one or names an existing local path (a local
    folder `org/name` wins over the Hub, as in transformers)."""
    match = _HUB_ID.match(model)
    if match is None or Path(model).expanduser().exists():
        return None
    return HubId(match["repo"], match["revision"])


def snapshot_folder(hub_id: HubId, weights: bool = True) -> Path:
    """The snapshot folder of `hub_id` in the HF cache, fetched first where the Hub is reachable."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError,
                                        RevisionNotFoundError)
    patterns = _CONFIG_PATTERNS + (_WEIGHT_PATTERNS if weights else [])
    offline = constants.HF_HUB_OFFLINE
    try:
        folder = snapshot_download(hub_id.repo, revision=hub_id.revision, allow_patterns=patterns,
                                   local_files_only=offline)
    except (LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError, HfHubHTTPError) as e:
        revision = f" at revision {hub_id.revision!r}" if hub_id.revision else ""
        reason = ("HF_HUB_OFFLINE is set and it is not in the cache" if offline
                  else f"it is not in the cache and the Hub did not provide it ({type(e).__name__})")
        raise FileNotFoundError(
            f"--model {hub_id.repo}{revision}: {reason}. The HF cache is {constants.HF_HUB_CACHE} (HF_HUB_CACHE / "
            f"HF_HOME move it); fetch the model there with `hf download {hub_id.repo}` on a machine with network "
            f"access, or pass a local folder.") from None
    log.info("--model %s: the snapshot %s", hub_id.repo + (f"@{hub_id.revision}" if hub_id.revision else ""),
             folder)
    return Path(folder)
