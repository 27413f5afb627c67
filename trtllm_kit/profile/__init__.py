"""Measuring a served model: ``trtllm-kit bench``, ``bench compare`` and ``profile``."""
