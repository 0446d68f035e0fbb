"""The project's own study campaign (the lab, not the library): its rows and plans per
language pair and size, the GPU job's schedule and lease arithmetic, the concurrency sweep
and core pinning, the tables and the lab's file locations. It imports resnmt (the study's
protocol: resnmt.study) and is never imported by it; ``benchmarks/curves.py`` runs it.
"""
