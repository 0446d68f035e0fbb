"""Data preparation: the corpora (``corpora``), the steps that turn one into fairseq data
(``pipeline``, ``textproc``) and the manifest a prepared directory carries (``manifest``).
Command line: ``resnmt-prepare`` (``resnmt.cli.prepare``)."""
