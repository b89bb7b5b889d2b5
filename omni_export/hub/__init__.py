"""Qualcomm AI Hub: compile, profile and on-device inference jobs for stored artifacts, judged by the same gate.

``jobs`` plans and runs the jobs through the ``qai-hub`` client (credentials come only from the client's own
configuration), ``ledger`` remembers submitted jobs so a rerun resumes, ``cli`` adds ``omni-export hub``.
"""
