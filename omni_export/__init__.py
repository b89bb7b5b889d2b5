"""omni-export: export on-device speech and agent models, and prove every artifact faithful before it ships."""
__version__ = "0.1.0"
