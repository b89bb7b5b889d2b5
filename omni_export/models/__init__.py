"""Checkpoint readers used by the family registry (``families``): safetensors directories (``checkpoint``) and
fp32 weights mapped from files (``mapped``)."""
