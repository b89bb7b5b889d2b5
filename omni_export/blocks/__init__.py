"""Model building blocks: the layers every family's ``nn.Module`` s are made of (``layers``) and their same-function
forms some targets need (``graph_forms``). They know torch, never a family, a target or the pipeline."""
