"""Qualcomm AI Hub: compile, profile and on-device inference jobs for stored artifacts, judged by the same gate.

By concern: ``client`` (every call to the ``qai-hub`` client; credentials only from the client's own configuration),
``ledger`` (submitted jobs, so a rerun resumes), ``payload`` (what is sent), ``judging`` (the device's figures
against the recipe the manifest pins), ``jobs`` (one artifact's jobs in order), ``cli`` (``omni-export hub``).
"""
