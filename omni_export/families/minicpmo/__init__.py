"""The MiniCPM-o 4.5 speech-output family: config (``config.py``), the TTS head on the llama family's model
(``tts.py``), the flow's encoder (``encoder.py``) and DiT estimator (``dit.py``), HiFT (``hift.py``), the official
key layouts (``checkpoint.py``), the exported graphs (``graphs.py``), the host loops (``flow_host.py``,
``hift_host.py``), the components (``components.py``: TTS head; ``vocoder.py``: Token2wav stages), the registry
entry (``family.py``) and the prompt sets (``prompts/``)."""
from .family import FAMILY

__all__ = ["FAMILY"]
