"""Loading a transformers model without drawing progress bars in the caller's output.

transformers 5 draws a "Loading weights" bar on stderr for every model it loads. In the CLI
it lands in the middle of a command's own output (``ingest`` has a bar of its own), in a
service in its logs; a library should not write to either. Bars are turned off for the load
only and put back as they were, so a caller that wants them keeps them for its own work.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["quiet_model_loading"]


@contextmanager
def quiet_model_loading() -> Iterator[None]:
    try:
        # The module, not the ``tqdm`` class that ``huggingface_hub.utils`` exports as well.
        hub = importlib.import_module("huggingface_hub.utils.tqdm")
        from transformers.utils import logging as hf_logging
    except ImportError:  # nothing that draws those bars is installed
        yield
        return
    was_on = hf_logging.is_progress_bar_enabled()
    hub_was_off = hub.are_progress_bars_disabled()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # and the hub's
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]
        if hub_was_off:
            hub.disable_progress_bars()
        elif not was_on:
            hub.enable_progress_bars()
