"""The user-facing floor: sessions, parity reports, localisation, the OpenVINO runner and the CLI.

It composes ``bridge.core``, ``exporters`` and ``ort_kernels`` for users; nothing below imports it.
"""
